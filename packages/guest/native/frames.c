/* The guest protocol's framing and the native front's strict reading of host headers (frames.h). */
#define _GNU_SOURCE
#include "frames.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* codec.ts RESYNC_END: the end of the preamble a host that takes over the stream sends first. */
static const char RESYNC_END[] = "\xff" "BOTHY-RESYNC-END";
#define RESYNC_END_LEN (sizeof RESYNC_END) /* with its trailing NUL, as codec.ts has it */

int frame_reader_init(struct frame_reader *r) {
  memset(r, 0, sizeof *r);
  /* Anonymous pages: only what a stream really uses becomes resident. */
  r->buf = mmap(NULL, MAX_FRAME, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r->buf == MAP_FAILED) return r->buf = NULL, -1;
  return 0;
}

int frame_reader_fill(struct frame_reader *r, int fd) {
  if (r->start > 0 && r->start + r->len == MAX_FRAME) {
    memmove(r->buf, r->buf + r->start, r->len);
    r->start = 0;
  }
  size_t room = MAX_FRAME - r->start - r->len;
  if (room == 0) return errno = ENOBUFS, -1;
  ssize_t n;
  do n = read(fd, r->buf + r->start + r->len, room);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -1;
  if (n == 0) return 0;
  r->len += (size_t)n;
  if (r->start + r->len > r->touched) r->touched = r->start + r->len;
  return 1;
}

int frame_reader_full(const struct frame_reader *r) {
  return r->start == 0 && r->len == MAX_FRAME;
}

/* The first pages, which small frames use, stay; only what a large payload touched goes back. */
#define KEPT_BYTES (128u * 1024)

void frame_reader_trim(struct frame_reader *r) {
  if (r->len != 0 || r->touched <= KEPT_BYTES) return;
  r->start = 0;
  madvise(r->buf + KEPT_BYTES, r->touched - KEPT_BYTES, MADV_DONTNEED);
  r->touched = 0;
}

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Drops bytes up to and past the resync end marker; answers whether it was found. */
static int hunt(struct frame_reader *r) {
  const unsigned char *at = memmem(r->buf + r->start, r->len, RESYNC_END, RESYNC_END_LEN);
  if (!at) {
    /* Keep only what could be the start of the marker. */
    size_t keep = r->len < RESYNC_END_LEN - 1 ? r->len : RESYNC_END_LEN - 1;
    r->start += r->len - keep;
    r->len = keep;
    return 0;
  }
  size_t skip = (size_t)(at - (r->buf + r->start)) + RESYNC_END_LEN;
  r->start += skip;
  r->len -= skip;
  r->hunting = 0;
  return 1;
}

int frame_take(struct frame_reader *r, struct frame *f) {
  if (r->hunting && !hunt(r)) return 0;
  if (r->len < FRAME_PREFIX) return 0;
  const unsigned char *p = r->buf + r->start;
  uint32_t header_len = be32(p), payload_len = be32(p + 4);
  if (header_len == 0 || header_len > MAX_HEADER || payload_len > MAX_PAYLOAD) return r->hunting = 1, -1;
  size_t total = FRAME_PREFIX + header_len + payload_len;
  if (r->len < total) return 0;
  if (!json_valid((const char *)p + FRAME_PREFIX, header_len)) {
    /* The Node agent's decoder counts a header that is not JSON as a framing error too. */
    r->start += total;
    r->len -= total;
    return r->hunting = 1, -1;
  }
  *f = (struct frame){
    .raw = p,
    .raw_len = total,
    .header = (const char *)p + FRAME_PREFIX,
    .header_len = header_len,
    .payload = p + FRAME_PREFIX + header_len,
    .payload_len = payload_len,
  };
  r->start += total;
  r->len -= total;
  if (r->len == 0) r->start = 0;
  return 1;
}

void frame_prefix(unsigned char out[FRAME_PREFIX], uint32_t header_len, uint32_t payload_len) {
  for (int i = 0; i < 4; i++) {
    out[i] = (unsigned char)(header_len >> (24 - 8 * i));
    out[4 + i] = (unsigned char)(payload_len >> (24 - 8 * i));
  }
}

/* ---- JSON, as JSON.parse judges it ------------------------------------------------------------ */

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static size_t skip_ws(const char *s, size_t n, size_t i) {
  while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
  return i;
}

/*
 * The index after the string that starts at s[i] ('"'), or 0 if it is not one. Bytes of 0x80 and
 * above are any character (UTF-8 decoding turns a broken sequence into U+FFFD, never into a quote,
 * backslash or control character, so they cannot end or break a string); a raw control character
 * is refused, as JSON.parse refuses it.
 */
static size_t string_end(const char *s, size_t n, size_t i) {
  for (i++; i < n;) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"') return i + 1;
    if (c < 0x20) return 0;
    if (c != '\\') {
      i++;
      continue;
    }
    if (i + 1 >= n) return 0;
    char e = s[i + 1];
    if (strchr("\"\\/bfnrt", e) && e != '\0') {
      i += 2;
    } else if (e == 'u') {
      if (i + 6 > n || !is_hex(s[i + 2]) || !is_hex(s[i + 3]) || !is_hex(s[i + 4]) || !is_hex(s[i + 5])) return 0;
      i += 6;
    } else {
      return 0;
    }
  }
  return 0;
}

/* The index after the JSON number at s[i], or 0 if there is none. */
static size_t number_end(const char *s, size_t n, size_t i) {
  if (i < n && s[i] == '-') i++;
  if (i >= n) return 0;
  if (s[i] == '0') i++;
  else if (s[i] >= '1' && s[i] <= '9') while (i < n && is_digit(s[i])) i++;
  else return 0;
  if (i < n && s[i] == '.') {
    if (++i >= n || !is_digit(s[i])) return 0;
    while (i < n && is_digit(s[i])) i++;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
    if (i >= n || !is_digit(s[i])) return 0;
    while (i < n && is_digit(s[i])) i++;
  }
  return i;
}

static size_t literal_end(const char *s, size_t n, size_t i) {
  static const char *const words[] = { "true", "false", "null" };
  for (size_t w = 0; w < 3; w++) {
    size_t len = strlen(words[w]);
    if (n - i >= len && memcmp(s + i, words[w], len) == 0) return i + len;
  }
  return 0;
}

/*
 * Iterative, with the open containers on a stack of its own, so a header nested 30,000 deep is
 * judged like any other and never exhausts the C stack.
 */
int json_valid(const char *s, size_t n) {
  static char closers[MAX_HEADER];
  if (n > MAX_HEADER) return 0;
  size_t depth = 0, i = skip_ws(s, n, 0);
  int want_key = 0;
  for (;;) {
    if (want_key) {
      if (i >= n || s[i] != '"' || !(i = string_end(s, n, i))) return 0;
      i = skip_ws(s, n, i);
      if (i >= n || s[i] != ':') return 0;
      i = skip_ws(s, n, i + 1);
      want_key = 0;
    }
    /* A value at i. */
    if (i >= n) return 0;
    if (s[i] == '{' || s[i] == '[') {
      char close = s[i] == '{' ? '}' : ']';
      closers[depth++] = close;
      i = skip_ws(s, n, i + 1);
      if (i < n && s[i] == close) {
        depth--;
        i++;
      } else {
        want_key = close == '}';
        continue;
      }
    } else if (s[i] == '"') {
      if (!(i = string_end(s, n, i))) return 0;
    } else if (s[i] == '-' || is_digit(s[i])) {
      if (!(i = number_end(s, n, i))) return 0;
    } else if (!(i = literal_end(s, n, i))) {
      return 0;
    }
    /* After a value: the end, a comma, or the close of containers. */
    for (;;) {
      i = skip_ws(s, n, i);
      if (depth == 0) return i == n;
      if (i >= n) return 0;
      if (s[i] == ',') {
        i = skip_ws(s, n, i + 1);
        want_key = closers[depth - 1] == '}';
        break;
      }
      if (s[i] != closers[depth - 1]) return 0;
      depth--;
      i++;
    }
  }
}

/* ---- the native subset ------------------------------------------------------------------------ */

/* The index after a valid JSON value at s[i] (the header was validated: only boundaries matter). */
static size_t value_end(const char *s, size_t n, size_t i) {
  if (s[i] == '"') return string_end(s, n, i);
  if (s[i] != '{' && s[i] != '[') {
    while (i < n && !strchr(",}] \t\n\r", s[i])) i++;
    return i;
  }
  size_t depth = 0;
  while (i < n) {
    if (s[i] == '"') {
      i = string_end(s, n, i);
      continue;
    }
    if (s[i] == '{' || s[i] == '[') depth++;
    else if (s[i] == '}' || s[i] == ']') depth--;
    i++;
    if (depth == 0) return i;
  }
  return n;
}

/* A plain integer: -?(0|[1-9][0-9]{0,14}) and nothing after it but the value's end. */
static int plain_int(const char *s, size_t len, long long *out) {
  size_t i = 0;
  int neg = len > 0 && s[0] == '-';
  if (neg) i++;
  if (i >= len || len - i > 15 || (s[i] == '0' && len - i > 1)) return 0;
  long long v = 0;
  for (; i < len; i++) {
    if (!is_digit(s[i])) return 0;
    v = v * 10 + (s[i] - '0');
  }
  *out = neg ? -v : v;
  return 1;
}

enum { K_T = 1, K_ID = 2, K_GEN = 4, K_MAX = 8, K_OTHER = 16 };

static int key_is(const char *k, size_t len, const char *name) {
  return strlen(name) == len && memcmp(k, name, len) == 0;
}

void frame_classify(const char *s, size_t n, struct host_frame *out) {
  memset(out, 0, sizeof *out);
  size_t i = skip_ws(s, n, 0);
  if (i >= n || s[i] != '{') return;
  i = skip_ws(s, n, i + 1);
  unsigned seen = 0;
  int unsure = 0; /* a key or value the subset does not read: never a native frame */
  int escaped_key = 0;
  long long gen = 0, max = 0;
  while (i < n && s[i] == '"') {
    size_t key_end = string_end(s, n, i);
    const char *key = s + i + 1;
    size_t key_len = key_end - i - 2;
    if (memchr(key, '\\', key_len)) escaped_key = 1; /* could decode to any name, "id" included */
    i = skip_ws(s, n, skip_ws(s, n, key_end) + 1);
    size_t end = value_end(s, n, i);
    const char *v = s + i;
    size_t v_len = end - i;
    int is_string = v[0] == '"' && !memchr(v, '\\', v_len);
    long long num = 0;
    int is_int = plain_int(v, v_len, &num);
    unsigned bit = escaped_key                        ? K_OTHER
                   : key_is(key, key_len, "t")        ? K_T
                   : key_is(key, key_len, "id")       ? K_ID
                   : key_is(key, key_len, "gen")      ? K_GEN
                   : key_is(key, key_len, "max_processes") ? K_MAX
                                                      : K_OTHER;
    if (bit != K_OTHER && (seen & bit)) unsure = 1; /* repeated: JSON.parse keeps the last */
    seen |= bit;
    if (bit == K_T) {
      out->t[0] = '\0';
      if (is_string && v_len - 2 < sizeof out->t) {
        memcpy(out->t, v + 1, v_len - 2);
        out->t[v_len - 2] = '\0';
      } else {
        unsure = 1;
      }
    } else if (bit == K_ID) {
      out->id = is_int && num >= 1 && num <= MAX_REQUEST_ID ? num : 0;
    } else if (bit == K_GEN) {
      if (is_int) gen = num;
      else unsure = 1;
    } else if (bit == K_MAX) {
      if (is_int && num >= 1 && num <= MAX_PROCESSES) max = num;
      else unsure = 1;
    }
    i = skip_ws(s, n, end);
    if (i < n && s[i] == ',') i = skip_ws(s, n, i + 1);
  }
  if (escaped_key) out->id = 0;
  if (unsure || escaped_key) return;
  if (strcmp(out->t, "hello_ack") == 0 && seen == (K_T | K_GEN)) {
    out->kind = FK_HELLO_ACK;
    out->gen = gen;
  } else if (strcmp(out->t, "resync") == 0 && seen == K_T) {
    out->kind = FK_RESYNC;
  } else if (strcmp(out->t, "limits") == 0 && seen == (K_T | K_ID | K_MAX) && out->id != 0) {
    out->kind = FK_LIMITS;
    out->max_processes = max;
  }
}
