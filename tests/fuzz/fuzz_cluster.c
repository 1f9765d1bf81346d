/* libFuzzer target for what paramserv reads of a Redis Cluster's answers
 * (src/replica/keys.h): the input is RESP, as a node sends it, read by
 * hiredis's own reader into replies; each one is taken as a redirection
 * (ps_redis_redirect: MOVED / ASK) and as a CLUSTER SLOTS answer
 * (ps_redis_slot_primary, for a few slots).  Whatever the bytes, an address
 * that comes back is one the config parser would take, and a refusal says
 * why. */
#include <hiredis/hiredis.h>
#include <hiredis/read.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "replica/keys.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_addr(const ps_addr *a) {
  char text[300];
  ps_addr back;
  if (a->port == 0 || a->host[0] == '\0')
    __builtin_trap();
  /* Formatted and parsed again: the same address. */
  ps_addr_format(a, text, sizeof text);
  if (ps_addr_parse(text, &back) != 0 || back.port != a->port || strcmp(back.host, a->host) != 0)
    __builtin_trap();
}

/* hiredis 0.14's reader allocates an aggregate's element array from its
 * header before reading any element (it has no maxelements): an input
 * announcing billions of elements tests the allocator, not paramserv.  A
 * RESP header of more than 4096 is skipped. */
static int huge_header(const uint8_t *d, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (d[i] != '*' && d[i] != '$' && d[i] != '%' && d[i] != '~')
      continue;
    unsigned long long v = 0;
    size_t j = i + 1;
    while (j < n && d[j] >= '0' && d[j] <= '9' && v <= 4096)
      v = v * 10 + (unsigned)(d[j++] - '0');
    if (v > 4096)
      return 1;
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (huge_header(data, size))
    return 0;
  redisReader *rd = redisReaderCreate();
  if (rd == NULL)
    return 0;
  if (redisReaderFeed(rd, (const char *)data, size) != REDIS_OK) {
    redisReaderFree(rd);
    return 0;
  }
  static const ps_addr asked = {.host = "10.0.0.7", .port = 7000};
  for (int n = 0; n < 8; n++) {
    void *reply = NULL;
    if (redisReaderGetReply(rd, &reply) != REDIS_OK || reply == NULL)
      break;
    ps_addr to;
    int kind = ps_redis_redirect(reply, &to);
    const redisReply *r = reply;
    if (kind != 0) {
      if (r->type != REDIS_REPLY_ERROR ||
          strncmp(r->str, kind == 1 ? "MOVED " : "ASK ", kind == 1 ? 6 : 4) != 0)
        __builtin_trap();
      check_addr(&to);
    }
    static const long long slots[] = {0, 1716, 16383, -1, 1LL << 40};
    for (size_t k = 0; k < sizeof slots / sizeof slots[0]; k++) {
      char why[256] = "";
      ps_addr out;
      if (ps_redis_slot_primary(reply, slots[k], &asked, &out, why, sizeof why) == 0)
        check_addr(&out);
      else if (why[0] == '\0')
        __builtin_trap();
    }
    freeReplyObject(reply);
  }
  redisReaderFree(rd);
  return 0;
}
