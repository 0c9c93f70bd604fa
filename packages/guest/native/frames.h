/*
 * The guest protocol's framing for the native front (front.c), the same wire as
 * packages/protocol/src/codec.ts: u32be header length | u32be payload length | JSON header |
 * payload, headers 1..64 KiB, payloads at most 1 MiB.
 */
#ifndef BOTHY_FRAMES_H
#define BOTHY_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_PREFIX 8u
#define MAX_HEADER (64u * 1024)
#define MAX_PAYLOAD (1024u * 1024)
#define MAX_FRAME (FRAME_PREFIX + MAX_HEADER + MAX_PAYLOAD)

/* The host's protocol generation (packages/protocol/src/guest-frames.ts PROTOCOL_GENERATION). */
#define PROTOCOL_GENERATION 2
/* The largest request id (guest-frames.ts requestId). */
#define MAX_REQUEST_ID 2147483647LL
/* The largest `max_processes` of a `limits` frame. */
#define MAX_PROCESSES 4194304LL

/* One whole frame, pointing into its reader's buffer: valid until the reader reads again. */
struct frame {
  const unsigned char *raw; /* prefix, header and payload, as they came */
  size_t raw_len;
  const char *header;
  size_t header_len;
  const unsigned char *payload;
  size_t payload_len;
};

/*
 * A byte stream cut into frames. Holds at most one frame's bytes (MAX_FRAME), so a peer can never
 * make it allocate more. After a framing error (a length out of range, a header that is not JSON),
 * `hunting` drops bytes up to the end of the host's resync preamble (codec.ts RESYNC_END), as the
 * Node agent's channel does.
 */
struct frame_reader {
  unsigned char *buf;
  size_t start, len;
  int hunting;
  size_t touched; /* the highest offset written since the last trim */
};

/* Allocates the reader's buffer; 0, or -1 without memory. */
int frame_reader_init(struct frame_reader *r);
/* Reads what fd has (one read); 1 read some, 0 at the end of the stream, -1 with errno (EAGAIN too). */
int frame_reader_fill(struct frame_reader *r, int fd);
/* Whether the buffer has no room left for a read (a whole frame is waiting to be taken). */
int frame_reader_full(const struct frame_reader *r);
/*
 * Takes the next whole frame: 1 with *f set, 0 when more bytes are needed, -1 on a framing error
 * (the reader then hunts for the resync end marker; the caller decides whether that is fatal).
 */
int frame_take(struct frame_reader *r, struct frame *f);
/* Gives the buffer's pages back once it is empty (a 1 MiB payload must not stay resident). */
void frame_reader_trim(struct frame_reader *r);

/* Whether bytes are one JSON text, exactly as JSON.parse of their UTF-8 decoding would judge. */
int json_valid(const char *s, size_t n);

/* What the native front makes of a host frame's header (see frame_classify). */
enum frame_kind {
  FK_OTHER = 0, /* not one the front answers: Node's (its zod schemas judge it) */
  FK_HELLO_ACK,
  FK_RESYNC,
  FK_LIMITS,
};

struct host_frame {
  enum frame_kind kind;
  /* The `t` of a frame whose `t` is a plain string ("" otherwise), at most 31 bytes. */
  char t[32];
  /* The request id: a plain integer 1..MAX_REQUEST_ID at the top level, the last if repeated; 0 for none. */
  long long id;
  long long gen;           /* FK_HELLO_ACK */
  long long max_processes; /* FK_LIMITS */
};

/*
 * Classifies a header that json_valid accepted. A strict subset of the host's schemas
 * (guest-frames.ts hostFrame): a frame is given a native kind only when every key is one that
 * kind has, none repeated, each value a plain integer in its range (no fraction, exponent or more
 * than 15 digits) or a string without escapes; anything else is FK_OTHER's, so the native side can
 * only ever accept less than zod does.
 */
void frame_classify(const char *header, size_t len, struct host_frame *out);

/* Writes a frame's 8-byte prefix. */
void frame_prefix(unsigned char out[FRAME_PREFIX], uint32_t header_len, uint32_t payload_len);

#endif
