/* Network addresses as the configuration and the messages write them:
 * "host:port", an IPv6 literal in brackets ([::1]:7000). */
#ifndef PS_COMMON_ADDR_H
#define PS_COMMON_ADDR_H

#include <stddef.h>
#include <stdint.h>

/* "host:port".  host is a name or an IPv4/IPv6 literal ([::1]:7000). */
typedef struct ps_addr {
  char host[256];
  uint16_t port;
} ps_addr;

/* Parse "host:port" / "[v6]:port": port 1-65535, host non-empty, printable,
 * without spaces or commas (an unbracketed IPv6 literal is refused as
 * ambiguous).  *out is written only on success.  @return 0 or PS_ECONFIG
 * (no message: the caller knows which setting it parses). */
int ps_addr_parse(const char *text, ps_addr *out);

/* "host:port" (an IPv6 host in brackets) into buf[len], truncated to fit;
 * @return buf. */
const char *ps_addr_format(const ps_addr *a, char *buf, size_t len);

#endif
