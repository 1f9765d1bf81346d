/* The settings of the cluster configuration: one table of every [section]
 * key (its type, bounds, default and help line), which drives parsing
 * (config.c), the defaults, the annotated example (systemd/cluster.conf)
 * and `paramserv local`'s config writer. */
#ifndef PS_COMMON_SETTINGS_H
#define PS_COMMON_SETTINGS_H

#include <stddef.h>

#include "common/config.h"

typedef enum ps_setting_type {
  PS_SETTING_STRING = 0,
  PS_SETTING_INT,        /* int64_t within [min, max] */
  PS_SETTING_DOUBLE,     /* double within [min, max] */
  PS_SETTING_BOOL,       /* int: yes|no|true|false|1|0|on|off */
  PS_SETTING_ENUM,       /* int: index into choices */
  PS_SETTING_ADDR,       /* ps_addr */
  PS_SETTING_ADDR_LIST,  /* comma-separated ps_addr list into an array + count */
} ps_setting_type;

typedef struct ps_setting {
  const char *section, *key;
  ps_setting_type type;
  size_t offset;             /* of the field in ps_config */
  size_t size;               /* of the field (strings: buffer size) */
  size_t count_offset;       /* ADDR_LIST: offset of its int count */
  double min, max;           /* INT, DOUBLE: value bounds; ADDR_LIST: entry count;
                                STRING: min = shortest length (the buffer bounds
                                the longest) */
  const char *const *choices;  /* ENUM, and STRING fields restricted to a set: NULL-terminated */
  const char *def;           /* default as text, NULL = required */
  const char *help;          /* one line, for the annotated example */
  /* NULL for the type's own parser; else a parser for a value the type alone
   * cannot describe (the cluster id's characters, split_bytes' words, lr's
   * open lower bound).  It stores into `field` (the setting's field in
   * ps_config) and returns 0, or returns PS_ECONFIG with the expected form
   * ("a number in (0, 1000]") written into why[len]. */
  int (*parse)(const struct ps_setting *s, const char *value, void *field, char *why,
               size_t len);
} ps_setting;

/* The table of every setting, in the order of the example file
 * (systemd/cluster.conf), sections kept together; ps_nsettings entries. */
#define PS_SETTINGS_MAX 128  /* room for the table's entries (settings.c checks) */
extern const ps_setting ps_settings[];
extern const size_t ps_nsettings;

/* The same, for callers outside the config module. */
const ps_setting *ps_config_settings(size_t *n);

#endif
