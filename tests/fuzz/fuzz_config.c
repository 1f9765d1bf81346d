/* libFuzzer target for the config parser: any text loads, or is refused with one clean line. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Large (tens of KiB): static rather than on the stack. */
static ps_config cfg;

static void check_addr(const ps_addr *a) {
  /* Every accepted address formats back into one that parses the same. */
  char buf[300];
  ps_addr b;
  if (memchr(a->host, '\0', sizeof a->host) == NULL ||
      ps_addr_parse(ps_addr_format(a, buf, sizeof buf), &b) != 0 || b.port != a->port ||
      strcmp(a->host, b.host) != 0)
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* ps_config_parse takes a C string; an embedded NUL just ends it early. */
  char *text = malloc(size + 1);
  if (text == NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  ps_errbuf eb = {0};
  int rc = ps_config_parse("fuzz", text, &cfg, &eb);
  if (rc != 0) {
    /* Errors are one printable line that names the input and carries the code. */
    if (rc != PS_ECONFIG || eb.code != rc || strncmp(eb.msg, "fuzz", 4) != 0 ||
        memchr(eb.msg, '\0', sizeof eb.msg) == NULL)
      __builtin_trap();
    /* What the file held is echoed with its control bytes masked. */
    for (const char *p = eb.msg; *p != '\0'; p++)
      if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
        __builtin_trap();
  } else {
    /* A success satisfies every rule the loader promises. */
    if (cfg.nps < 1 || cfg.nps > PS_CONFIG_MAX_NODES || cfg.nworkers < 1 ||
        cfg.nworkers > PS_CONFIG_MAX_NODES || cfg.replicas_to_aggregate > cfg.nworkers ||
        cfg.cluster_id[0] == '\0' || cfg.batch < 1 || !(cfg.lr > 0))
      __builtin_trap();
    check_addr(&cfg.chief);
    check_addr(&cfg.redis);
    for (int i = 0; i < cfg.nps; i++)
      check_addr(&cfg.ps[i]);
    for (int i = 0; i < cfg.nworkers; i++)
      check_addr(&cfg.workers[i]);
  }
  free(text);
  return 0;
}
