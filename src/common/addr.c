/* Network addresses: "host:port" parsed and formatted (addr.h). */
#include "common/addr.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "common/parse.h"
#include "paramserv/error.h"

int ps_addr_parse(const char *text, ps_addr *out) {
  const char *host = text, *end, *port;
  if (text[0] == '[') {
    host = text + 1;
    end = strchr(host, ']');
    if (end == NULL || end[1] != ':')
      return PS_ECONFIG;
    port = end + 2;
  } else {
    end = strrchr(text, ':');
    if (end == NULL || memchr(text, ':', (size_t)(end - text)) != NULL)
      return PS_ECONFIG;
    port = end + 1;
  }
  size_t n = (size_t)(end - host);
  if (n == 0 || n >= sizeof out->host)
    return PS_ECONFIG;
  for (size_t i = 0; i < n; i++)
    if (!isgraph((unsigned char)host[i]) || strchr("[],", host[i]) != NULL)
      return PS_ECONFIG;
  /* strtoll would also take a sign or leading blanks. */
  int64_t p;
  if (!isdigit((unsigned char)port[0]) || ps_parse_i64(port, 1, 65535, &p) != 0)
    return PS_ECONFIG;
  memcpy(out->host, host, n);
  out->host[n] = '\0';
  out->port = (uint16_t)p;
  return 0;
}

const char *ps_addr_format(const ps_addr *a, char *buf, size_t len) {
  if (len > 0 && strchr(a->host, ':') != NULL)
    snprintf(buf, len, "[%s]:%u", a->host, (unsigned)a->port);
  else if (len > 0)
    snprintf(buf, len, "%s:%u", a->host, (unsigned)a->port);
  return buf;
}
