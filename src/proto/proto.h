/* The wire protocol: encoding and decoding of frames, no I/O, so that it can
 * be unit-tested and fuzzed.  The byte layout is in src/proto/PROTOCOL.md. */
#ifndef PS_PROTO_PROTO_H
#define PS_PROTO_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "paramserv/error.h"
#include "ps/state.h"

#define PS_PROTO_MAGIC 0x56525350u  /* the bytes "PSRV" */
#define PS_PROTO_VERSION 4
#define PS_PROTO_HEADER_SIZE 24
#define PS_PROTO_NONCE_SIZE 32
#define PS_PROTO_PROOF_SIZE 32      /* HMAC-SHA256 */
#define PS_PROTO_CLUSTER_ID_MAX 63
#define PS_PROTO_ERROR_MSG_MAX 1024
/* Room for a header plus the fixed part of any message (not its floats). */
#define PS_PROTO_PREFIX_MAX 256
/* Payload cap of frames that carry no floats. */
#define PS_PROTO_SMALL_PAYLOAD_MAX 2048

typedef enum ps_msg_type {
  PS_MSG_CHALLENGE = 1,   /* server -> client, first frame on a connection */
  PS_MSG_HELLO = 2,       /* client -> server: identity and auth proof */
  PS_MSG_WELCOME = 3,     /* server -> client: accepted */
  PS_MSG_PULL = 4,
  PS_MSG_PULL_REPLY = 5,
  PS_MSG_PUSH = 6,
  PS_MSG_PUSH_ACK = 7,
  PS_MSG_STATS = 8,
  PS_MSG_STATS_REPLY = 9,
  PS_MSG_ERROR = 10,
  PS_MSG_PING = 11,
  PS_MSG_PONG = 12,
  /* Version 2: the chief's control of the shards (PROTOCOL.md, "The chief"). */
  PS_MSG_CUT = 13,        /* chief -> shard: copy the state, hold pushes */
  PS_MSG_CUT_REPLY = 14,
  PS_MSG_RESUME = 15,     /* chief -> shard: apply the held pushes; answered by PONG */
  PS_MSG_FETCH = 16,      /* chief -> shard: a piece of the copied state */
  PS_MSG_FETCH_REPLY = 17,
  PS_MSG_LOAD = 18,       /* chief -> shard: a piece of a state to start from; PONG */
  PS_MSG_STOP = 19,       /* chief -> shard -> workers: the run is over */
  /* Ring mode ([cluster] mode = ring: PROTOCOL.md, "The ring"). */
  PS_MSG_RING_JOIN = 20,  /* member -> its successor, after HELLO: the view it dials for */
  PS_MSG_RING_CHUNK = 21, /* member -> its successor: a piece of an all-reduce */
  PS_MSG_TYPE_MAX = 21
} ps_msg_type;

typedef enum ps_role { PS_ROLE_WORKER = 1, PS_ROLE_CHIEF = 2, PS_ROLE_PS = 3, PS_ROLE_TOOL = 4 } ps_role;

/* PUSH_ACK status. */
enum { PS_PUSH_APPLIED = 0, PS_PUSH_DUPLICATE = 1, PS_PUSH_STALE = 2 };

/* ERROR flags. */
#define PS_ERROR_RETRY 0x1u  /* the client may reconnect and try again */

typedef struct ps_frame_header {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t flags;
  uint64_t request_id;  /* echoed in the reply */
  uint32_t length;      /* payload bytes after the header */
} ps_frame_header;

typedef struct ps_msg_challenge {
  uint8_t nonce[PS_PROTO_NONCE_SIZE];
  uint8_t role;          /* the server's */
  uint32_t index;
  uint64_t incarnation;
} ps_msg_challenge;

typedef struct ps_msg_hello {
  uint8_t role;          /* ps_role of the client */
  uint32_t index;        /* its index within the role */
  uint64_t incarnation;  /* its incarnation (process start) */
  uint64_t layout_hash;
  uint8_t proof[PS_PROTO_PROOF_SIZE];
  char cluster_id[PS_PROTO_CLUSTER_ID_MAX + 1];  /* NUL-terminated */
} ps_msg_hello;

typedef struct ps_msg_welcome {
  uint32_t index;         /* shard index */
  uint8_t consistency;    /* the shard's mode, see ps/shard.h */
  uint64_t incarnation;   /* the shard's */
  uint64_t layout_hash;
  uint64_t slice_floats;  /* floats in the shard's slice */
  uint64_t version;       /* updates applied so far */
  uint64_t global_step;
  uint32_t max_payload;   /* the cap the shard enforces */
} ps_msg_welcome;

/* Sparse sections (PROTOCOL.md, "Sparse blocks"): after a PULL's fixed
 * part, a PULL_REPLY's or a PUSH's floats, zero or more blocks, one per
 * table in ascending table order, each a 16-byte head (table u32, dim u32,
 * n u64, n >= 1) and then, by kind: K the n keys (u64, strictly
 * ascending: a PULL's rows to read), KV the keys and n * dim floats (a
 * PUSH's gradients of those rows), V the n * dim floats (a PULL_REPLY's
 * rows, in the order its PULL asked).  Keys and floats need not be
 * aligned in a payload: read them with memcpy. */
#define PS_PROTO_SPARSE_DIM_MAX 65536
#define PS_SPARSE_HEAD 16

typedef enum ps_sparse_kind { PS_SPARSE_K = 1, PS_SPARSE_KV = 2, PS_SPARSE_V = 3 } ps_sparse_kind;

/* Bag blocks (PROTOCOL.md, "Bags"): a block whose table has this bit holds
 * bags, pooled on the shard: a PULL's B block n bags (n heads of sample
 * u32 and count u32, samples strictly ascending, counts >= 1, then their
 * keys, u64, any order, repeats allowed), a PULL_REPLY's P block each bag's
 * pooled row (n * dim floats, as V), a PUSH's BG block B's body and then
 * each bag's gradient (n * dim floats). */
#define PS_SPARSE_BAGS 0x80000000u
/* Or'd into the kind given to ps_sparse_check: bag blocks are accepted
 * (the wire's sections); without it they are refused (a journal's, a
 * state's: a shard turns bags into rows before it applies them). */
#define PS_SPARSE_BAGS_OK 0x10

/* A message's sparse blocks: `bytes` of them at `data` (decoded: inside
 * the payload; to encode: the caller's, valid blocks). */
typedef struct ps_sparse {
  uint64_t bytes;
  const uint8_t *data;
} ps_sparse;

/* One block, pointing into its section: keys NULL for V, values NULL for K. */
typedef struct ps_sparse_block {
  uint32_t table, dim;    /* table: without PS_SPARSE_BAGS */
  uint64_t n;             /* rows, or bags */
  int bags;               /* a bag block: heads, and nkeys keys in all */
  const uint8_t *heads;   /* bags: n of (sample u32, count u32), little-endian */
  uint64_t nkeys;         /* keys: n, or the bags' counts summed */
  const uint8_t *keys;    /* nkeys u64, little-endian */
  const uint8_t *values;  /* n * dim floats, row (or bag) i at values + 4 * dim * i */
} ps_sparse_block;

typedef struct ps_sparse_iter {
  const uint8_t *p, *end;
} ps_sparse_iter;

/* Walk the blocks of a section ps_sparse_check accepted (a decoded
 * message's): @return 1 and the next block in *out, or 0 at the end. */
void ps_sparse_iter_init(const ps_sparse *s, ps_sparse_iter *it);
int ps_sparse_iter_next(ps_sparse_iter *it, ps_sparse_kind kind, ps_sparse_block *out);

/* Bytes of one block of this kind, dim and n (UINT64_MAX on overflow). */
uint64_t ps_sparse_block_bytes(ps_sparse_kind kind, uint32_t dim, uint64_t n);

/* Bytes of one bag block of this kind (K: B, KV: BG, V: P), dim, n bags
 * and nkeys keys in them (UINT64_MAX on overflow). */
uint64_t ps_sparse_bag_bytes(ps_sparse_kind kind, uint32_t dim, uint64_t n, uint64_t nkeys);

/* A PUSH's section (checked, KV | PS_SPARSE_BAGS_OK) with each BG block
 * turned into the KV block it amounts to: its distinct keys ascending,
 * each key's gradient the sum of its bags' gradients, once for each time a
 * bag holds it, summed in the order of (key, bag); KV blocks as they are.
 * Into *buf (grown; *cap its bytes), *out bytes.  @return 0 or -ENOMEM. */
int ps_sparse_unbag(const uint8_t *data, uint64_t bytes, uint8_t **buf, size_t *cap,
                    uint64_t *out);

/* dst[0 .. dim) += the dim little-endian floats at src (not aligned). */
void ps_sparse_add_row(float *dst, const uint8_t *src, uint32_t dim);

/* Does a checked section of this kind hold a bag block? */
int ps_sparse_has_bags(ps_sparse_kind kind, const uint8_t *data, uint64_t bytes);

/* Write one block at out (cap bytes): keys (K, KV; n ascending) and values
 * (KV, V; n * dim floats).  @return its bytes, or 0 when it does not fit or
 * would be refused (n 0, dim outside 1..PS_PROTO_SPARSE_DIM_MAX, keys not
 * strictly ascending, a NULL array it needs). */
size_t ps_sparse_put(uint8_t *out, size_t cap, ps_sparse_kind kind, uint32_t table, uint32_t dim,
                     uint64_t n, const uint64_t *keys, const float *values);

/* Is data[0 .. bytes) a section of blocks of this kind, exactly?  Tables
 * strictly ascending, dims in range, n >= 1, keys strictly ascending, no
 * byte left over; bag blocks only with PS_SPARSE_BAGS_OK in kind (samples
 * strictly ascending, counts >= 1).  @return 0 with the number of blocks in *blocks (may be
 * NULL), or PS_EFORMAT with one line in eb ("sparse block 2 (table 5): key
 * 17 (row 3) not above key 17, expected strictly ascending keys"). */
int ps_sparse_check(int kind, const uint8_t *data, uint64_t bytes, uint32_t *blocks,
                    ps_errbuf *eb);

typedef struct ps_msg_pull {
  uint32_t worker;
  uint64_t step;          /* the step the worker will compute at (sync, ssp) */
  ps_sparse sparse;       /* K blocks: the rows to send back (none: a dense pull) */
} ps_msg_pull;

/* A message that carries floats points at them inside the decoded buffer:
 * count * 4 little-endian bytes, not necessarily aligned (use memcpy). */
typedef struct ps_msg_pull_reply {
  uint64_t version;
  uint64_t global_step;
  uint64_t count;
  const uint8_t *data;
  ps_sparse sparse;       /* V blocks, after the floats: the rows asked */
} ps_msg_pull_reply;

typedef struct ps_msg_push {
  uint32_t worker;
  uint64_t incarnation;
  uint64_t seq;           /* per (worker, incarnation, shard), from 1 */
  uint64_t step;          /* the global step the gradient was computed at */
  uint64_t count;
  const uint8_t *data;
  ps_sparse sparse;       /* KV blocks, after the floats: the rows' gradients */
} ps_msg_push;

typedef struct ps_msg_push_ack {
  uint64_t seq;
  uint64_t version;
  uint64_t global_step;
  uint32_t status;        /* PS_PUSH_* */
} ps_msg_push_ack;

/* STATS_REPLY flags. */
#define PS_STATS_INITIALIZED 0x1u  /* the shard holds a state (restored, loaded or self-initialized) */
#define PS_STATS_PAUSED 0x2u       /* a CUT holds its pushes */

typedef struct ps_msg_stats_reply {
  uint64_t version, global_step, incarnation;
  uint64_t pushes_applied, pushes_duplicate, pushes_stale, pulls;
  uint64_t bytes_in, bytes_out, clients;
  uint64_t flags;         /* PS_STATS_* */
} ps_msg_stats_reply;

/* CUT replies and LOADs carry a shard's state image: its fixed fields, a
 * ps_state_info (ps/state.h: the image's one definition), travel in the
 * frame; its floats in FETCH replies and LOAD pieces. */

/* Every chief -> shard frame (CUT, RESUME, FETCH, LOAD, STOP) carries
 * `fence`: the fencing token of the chief's lease (>= 1; 0 is refused).  A
 * shard refuses a token lower than the highest it has seen (PROTOCOL.md,
 * "Fencing"). */
typedef struct ps_msg_cut {
  uint64_t fence;
  uint64_t cut_id;
  uint32_t hold_ms;       /* resume by itself after this long without a RESUME */
} ps_msg_cut;

typedef struct ps_msg_cut_reply {
  uint64_t cut_id;
  ps_state_info state;
} ps_msg_cut_reply;

typedef struct ps_msg_resume {
  uint64_t fence;
  uint64_t cut_id;        /* the cut to end; echoed as the PONG's token */
} ps_msg_resume;

typedef struct ps_msg_fetch {
  uint64_t fence;
  uint64_t cut_id, offset, count;  /* floats of the image */
} ps_msg_fetch;

typedef struct ps_msg_fetch_reply {
  uint64_t cut_id, offset, count;
  const uint8_t *data;
} ps_msg_fetch_reply;

typedef struct ps_msg_load {
  uint64_t fence;
  ps_state_info state;
  uint64_t offset, count;  /* this piece, in floats of the image */
  const uint8_t *data;
} ps_msg_load;

typedef struct ps_msg_stop {
  uint64_t fence;         /* the chief's; a shard forwards it to its workers */
  uint64_t step;          /* the global step the run ended at */
} ps_msg_stop;

/* The view (epoch) and the step a ring member dials its successor for. */
typedef struct ps_msg_ring_join {
  uint64_t epoch;
  uint64_t step;
  uint32_t rank;          /* the sender's worker index */
} ps_msg_ring_join;

/* Floats [offset, offset + count) of the all-reduce of `step` in view
 * `epoch`, at hop `phase` (0 .. 2 * (members - 1) - 1: scatter-reduce
 * hops first, then all-gather hops). */
typedef struct ps_msg_ring_chunk {
  uint64_t epoch;
  uint64_t step;
  uint32_t phase;
  uint64_t offset;
  uint64_t count;
  const uint8_t *data;
} ps_msg_ring_chunk;

typedef struct ps_msg_error {
  int32_t code;           /* a PS_E* or -errno value */
  uint32_t flags;         /* PS_ERROR_* */
  char message[PS_PROTO_ERROR_MSG_MAX + 1];  /* NUL-terminated, one line */
} ps_msg_error;

typedef struct ps_msg_ping {
  uint64_t token;         /* echoed in the PONG */
} ps_msg_ping;

typedef struct ps_msg {
  ps_msg_type type;
  union {
    ps_msg_challenge challenge;
    ps_msg_hello hello;
    ps_msg_welcome welcome;
    ps_msg_pull pull;
    ps_msg_pull_reply pull_reply;
    ps_msg_push push;
    ps_msg_push_ack push_ack;
    ps_msg_stats_reply stats_reply;
    ps_msg_error error;
    ps_msg_ping ping;   /* PING and PONG; RESUME and LOAD are answered by a PONG */
    ps_msg_cut cut;
    ps_msg_cut_reply cut_reply;
    ps_msg_resume resume;
    ps_msg_fetch fetch;
    ps_msg_fetch_reply fetch_reply;
    ps_msg_load load;
    ps_msg_stop stop;
    ps_msg_ring_join ring_join;
    ps_msg_ring_chunk ring_chunk;
  } u;
} ps_msg;

/* Decode and check the 24-byte header at buf (at least
 * PS_PROTO_HEADER_SIZE bytes).  Rejects a wrong magic (PS_EFORMAT), another
 * version (PS_EVERSION, naming both), an unknown type (PS_EFORMAT), nonzero
 * header flags (PS_EFORMAT: none are defined in version 3), and a payload
 * longer than `max_payload` for float-carrying types (PULL_REPLY, PUSH,
 * FETCH_REPLY, LOAD, RING_CHUNK) or
 * than PS_PROTO_SMALL_PAYLOAD_MAX for the others (PS_EFORMAT); each with a
 * one-line message in eb.  *h is filled in even when the header is refused,
 * so that an ERROR reply can echo its request_id. */
int ps_proto_decode_header(const uint8_t *buf, uint64_t max_payload, ps_frame_header *h,
                           ps_errbuf *eb);

/* Decode the payload of a frame whose header `h` was accepted; `len` must
 * equal h->length.  Checks the exact length of every fixed part, that
 * counts match the bytes present (PULL_REPLY, PUSH, FETCH_REPLY, LOAD,
 * RING_CHUNK), that
 * padding and reserved fields are zero, that roles, PUSH_ACK status, ERROR
 * code and flags, STATS_REPLY flags and a state block's fields (each at
 * most its PS_STATE_FIELDS maximum) hold defined values, that the fence token of CUT, RESUME,
 * FETCH, LOAD and STOP is not 0, that a LOAD piece lies within its
 * image (offset + count <= image_floats), and that strings fit and hold only
 * allowed bytes (cluster id [A-Za-z0-9_.-], 1..63; ERROR message printable
 * ASCII).  For PULL_REPLY, PUSH, FETCH_REPLY, LOAD and RING_CHUNK, out->u.*.data points
 * into `payload`, valid as long as payload is; nothing else points into it.
 * @return 0 or PS_EFORMAT with a message naming the type and what was
 * wrong; on error *out is zeroed. */
int ps_proto_decode(const ps_frame_header *h, const uint8_t *payload, size_t len, ps_msg *out,
                    ps_errbuf *eb);

/* Encode a whole frame (header + payload) of any type into out, which has
 * `cap` bytes.  For PULL_REPLY, PUSH, FETCH_REPLY, LOAD and RING_CHUNK the floats are
 * copied from msg->u.*.data.  An ERROR message is cut at PS_PROTO_ERROR_MSG_MAX bytes
 * and any byte outside printable ASCII is sent as '?', so that any error
 * text can be sent.  @return the frame's length, or 0 if it does not fit or
 * if msg is something ps_proto_decode would refuse (unknown type or role,
 * bad cluster id, PUSH_ACK status > 2, ERROR code >= 0 or unknown ERROR
 * flags, unknown STATS_REPLY flags, a CUT_REPLY or LOAD state with a field
 * over its maximum, a fence token of 0 in CUT, RESUME, FETCH, LOAD or STOP,
 * a LOAD piece outside its image, a count whose frame
 * length overflows 32 bits, NULL data with a nonzero count). */
size_t ps_proto_encode(const ps_msg *msg, uint64_t request_id, uint8_t *out, size_t cap);

/* Encode only the header and fixed part of a PULL_REPLY, PUSH, FETCH_REPLY,
 * LOAD or RING_CHUNK frame into out (PS_PROTO_PREFIX_MAX bytes); the count * 4 bytes of
 * floats must follow it on the wire (so that large slices are sent without
 * a copy).  msg->u.*.data is not read.  @return the prefix length (56 for
 * PULL_REPLY and FETCH_REPLY, 72 for PUSH and RING_CHUNK, 104 for LOAD), or 0 for any other
 * type, a count whose frame length overflows 32 bits, or a LOAD that
 * ps_proto_encode would refuse. */
size_t ps_proto_encode_prefix(const ps_msg *msg, uint64_t request_id, uint8_t *out);

/* The largest payload a frame of float-carrying type can need for a slice
 * of `floats` floats (96 + 4 * floats, saturating): what a shard passes as
 * max_payload.  A FETCH_REPLY or LOAD piece is at most `floats` long. */
uint64_t ps_proto_max_payload(uint64_t floats);

/* The same with room for `sparse` bytes of sparse blocks (saturating). */
uint64_t ps_proto_max_payload_sparse(uint64_t floats, uint64_t sparse);

/* HMAC-SHA256 (OpenSSL) with key `secret` over the server's nonce and the
 * HELLO's identity: nonce || role || index || incarnation || layout_hash ||
 * cluster_id, integers little-endian, as PROTOCOL.md gives.  hello->proof
 * is not read.  Should OpenSSL fail, proof is all zeros, which the server
 * refuses like any wrong proof. */
void ps_proto_auth_proof(const uint8_t *secret, size_t secret_len,
                         const uint8_t nonce[PS_PROTO_NONCE_SIZE], const ps_msg_hello *hello,
                         uint8_t proof[PS_PROTO_PROOF_SIZE]);

/* Recompute the proof and compare in constant time (CRYPTO_memcmp).
 * @return 1 when hello->proof is right. */
int ps_proto_auth_check(const uint8_t *secret, size_t secret_len,
                        const uint8_t nonce[PS_PROTO_NONCE_SIZE], const ps_msg_hello *hello);

/* The fence token of a CUT, RESUME, FETCH, LOAD or STOP; 0 for any other
 * type. */
uint64_t ps_proto_fence(const ps_msg *m);

/* Set the fence token of a CUT, RESUME, FETCH, LOAD or STOP.  @return 0, or
 * -1 (nothing changed) for any other type. */
int ps_proto_set_fence(ps_msg *m, uint64_t fence);

/* "PUSH", "worker", ...; "unknown" for any other value.  Static strings. */
const char *ps_proto_type_name(int type);
const char *ps_role_name(int role);

#endif
