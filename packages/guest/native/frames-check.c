/*
 * frames-check SEED: runs the native front's frame reader and header classifier (frames.c) on the
 * byte stream on stdin and prints what they made of it, for packages/guest/test/native-frames.unit.test.ts.
 * The stream reaches the reader in pieces of 1..4096 bytes (chosen from SEED), as a channel
 * delivers it. One line per event:
 *
 *   frame HEADER_LEN PAYLOAD_LEN KIND ID VALUE T   a whole frame (VALUE: gen or max_processes)
 *   error                                         a framing error (the reader hunts for the marker)
 *   end BUFFERED                                  stdin ended with BUFFERED bytes unread
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "frames.h"

static const char *const kinds[] = { "other", "hello_ack", "resync", "limits" };

int main(int argc, char **argv) {
  unsigned seed = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 1;
  struct frame_reader r;
  int p[2];
  if (frame_reader_init(&r) < 0 || pipe2(p, O_NONBLOCK) < 0) return perror("frames-check"), 1;
  static char chunk[4096];
  for (;;) {
    size_t want = 1 + (size_t)(rand_r(&seed) % sizeof chunk);
    ssize_t n = read(0, chunk, want);
    if (n < 0) return perror("frames-check: read"), 1;
    if (n == 0) break;
    if (write(p[1], chunk, (size_t)n) != n) return perror("frames-check: write"), 1; /* 4 KiB fits an empty pipe */
    /* What the pipe holds, in as many fills as the reader's room needs, frames taken between. */
    for (;;) {
      int filled = frame_reader_fill(&r, p[0]);
      if (filled < 0 && errno == EAGAIN) break;
      if (filled < 0 && errno != ENOBUFS) return perror("frames-check: fill"), 1;
      struct frame f;
      for (int got; (got = frame_take(&r, &f)) != 0;) {
        if (got < 0) {
          puts("error");
          continue;
        }
        struct host_frame h;
        frame_classify(f.header, f.header_len, &h);
        long long value = h.kind == FK_HELLO_ACK ? h.gen : h.kind == FK_LIMITS ? h.max_processes : 0;
        printf("frame %zu %zu %s %lld %lld %s\n", f.header_len, f.payload_len, kinds[h.kind], h.id, value, h.t);
      }
      frame_reader_trim(&r);
    }
  }
  printf("end %zu\n", r.len);
  return 0;
}
