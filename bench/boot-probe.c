/*
 * bench/boot-split's `native` variant: the least a native agent does before a create is
 * answered, to measure the CPU floor of a boot without Node (issue #31 item 2). It says hello,
 * answers the host's `limits` with `done` after writing pids.max as the agent does, and exits when
 * its stdin ends. It is a probe, not an agent: it looks for the two frame types by their text and
 * parses nothing else. Built and bind-mounted by bench/boot-split.ts only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void frame(const char *header) {
  char buf[512];
  uint32_t n = (uint32_t)strlen(header);
  unsigned char prefix[8] = { n >> 24, n >> 16, n >> 8, n, 0, 0, 0, 0 };
  memcpy(buf, prefix, 8);
  memcpy(buf + 8, header, n);
  if (write(1, buf, 8 + n) < 0) exit(1);
}

static int read_all(unsigned char *buf, size_t len) {
  for (size_t off = 0; off < len;) {
    ssize_t r = read(0, buf + off, len - off);
    if (r <= 0) return -1;
    off += (size_t)r;
  }
  return 0;
}

int main(void) {
  char hello[128];
  snprintf(hello, sizeof hello, "{\"t\":\"hello\",\"gen\":2,\"agent\":\"boot-probe\",\"pid\":%d}", (int)getpid());
  frame(hello);
  static unsigned char buf[(64 + 1024) * 1024 + 1];
  for (;;) {
    unsigned char prefix[8];
    if (read_all(prefix, 8) < 0) return 0;
    uint32_t h = (uint32_t)prefix[0] << 24 | prefix[1] << 16 | prefix[2] << 8 | prefix[3];
    uint32_t p = (uint32_t)prefix[4] << 24 | prefix[5] << 16 | prefix[6] << 8 | prefix[7];
    if (h == 0 || h > 64 * 1024 || p > 1024 * 1024 || read_all(buf, h + p) < 0) return 1;
    buf[h] = 0;
    if (!strstr((char *)buf, "\"t\":\"limits\"")) continue;
    const char *cg = getenv("BOTHY_COMMANDS_CGROUP");
    if (cg) {
      char path[256];
      snprintf(path, sizeof path, "%s/pids.max", cg);
      FILE *f = fopen(path, "w");
      if (f) fputs("1024", f), fclose(f);
    }
    const char *id = strstr((char *)buf, "\"id\":");
    char done[64];
    snprintf(done, sizeof done, "{\"t\":\"done\",\"id\":%ld}", id ? strtol(id + 5, NULL, 10) : 0L);
    frame(done);
  }
}
