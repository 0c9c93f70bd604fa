/*
 * bench/boot-split's `native` variant: the least a native agent does, to measure the floor of a
 * gVisor sandbox without Node (issue #31 items 2 and 3). It says hello, answers the host's
 * `limits` with `done` after writing pids.max as the agent does, runs an `exec` (one at a time,
 * `/bin/sh -c CMD` with stdout and stderr on pipes, joined to the commands' cgroup as the agent's
 * spawner does) answering `started`, `output` and `exited`, and exits when its stdin ends. It is a
 * probe, not an agent: it finds the frames' fields by their text (the bench sends `cmd` without
 * escapes) and checks nothing else. Built and bind-mounted by bench/boot-split.ts only.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

static void frame(const char *header, const void *payload, uint32_t plen) {
  static char buf[8 + 512 + 65536];
  uint32_t n = (uint32_t)strlen(header);
  unsigned char prefix[8] = { n >> 24, n >> 16, n >> 8, n, plen >> 24, plen >> 16, plen >> 8, plen };
  memcpy(buf, prefix, 8);
  memcpy(buf + 8, header, n);
  memcpy(buf + 8 + n, payload, plen);
  for (size_t off = 0, len = 8 + n + plen; off < len;) {
    ssize_t w = write(1, buf + off, len - off);
    if (w <= 0) exit(1);
    off += (size_t)w;
  }
}

static int read_all(unsigned char *buf, size_t len) {
  for (size_t off = 0; off < len;) {
    ssize_t r = read(0, buf + off, len - off);
    if (r <= 0) return -1;
    off += (size_t)r;
  }
  return 0;
}

static long field_int(const char *h, const char *name) {
  const char *at = strstr(h, name);
  return at ? strtol(at + strlen(name), NULL, 10) : 0;
}

static void exec_one(const char *h, long id) {
  const char *at = strstr(h, "\"cmd\":\"");
  if (!at) return;
  char cmd[4096];
  size_t n = strcspn(at + 7, "\"");
  if (n >= sizeof cmd) return;
  memcpy(cmd, at + 7, n);
  cmd[n] = 0;
  int out[2];
  if (pipe2(out, O_CLOEXEC) < 0) return;
  const char *cg = getenv("BOTHY_COMMANDS_CGROUP");
  char procs[256];
  snprintf(procs, sizeof procs, "%s/cgroup.procs", cg ? cg : "/nonexistent");
  pid_t pid = vfork();
  if (pid == 0) {
    setsid();
    dup2(out[1], 1);
    dup2(out[1], 2);
    /* Only system calls in a vfork child: it shares the parent's memory, heap included. */
    int fd = cg ? open(procs, O_WRONLY) : -1;
    if (fd >= 0) {
      char pid[16];
      int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
      if (write(fd, pid, (size_t)n) < 0) _exit(126);
      close(fd);
    }
    if (chdir("/workspace") < 0) _exit(127);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  char header[128];
  snprintf(header, sizeof header, "{\"t\":\"started\",\"id\":%ld,\"pid\":%d}", id, (int)pid);
  frame(header, "", 0);
  static char data[65536];
  ssize_t r;
  while ((r = read(out[0], data, sizeof data)) > 0) {
    snprintf(header, sizeof header, "{\"t\":\"output\",\"id\":%ld,\"fd\":1}", id);
    frame(header, data, (uint32_t)r);
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    snprintf(header, sizeof header, "{\"t\":\"exited\",\"id\":%ld,\"code\":null,\"signal\":\"%d\"}", id, WTERMSIG(status));
  else
    snprintf(header, sizeof header, "{\"t\":\"exited\",\"id\":%ld,\"code\":%d,\"signal\":null}", id, WEXITSTATUS(status));
  frame(header, "", 0);
}

int main(void) {
  char hello[128];
  snprintf(hello, sizeof hello, "{\"t\":\"hello\",\"gen\":2,\"agent\":\"boot-probe\",\"pid\":%d}", (int)getpid());
  frame(hello, "", 0);
  static unsigned char buf[(64 + 1024) * 1024 + 1];
  for (;;) {
    unsigned char prefix[8];
    if (read_all(prefix, 8) < 0) return 0;
    uint32_t h = (uint32_t)prefix[0] << 24 | prefix[1] << 16 | prefix[2] << 8 | prefix[3];
    uint32_t p = (uint32_t)prefix[4] << 24 | prefix[5] << 16 | prefix[6] << 8 | prefix[7];
    if (h == 0 || h > 64 * 1024 || p > 1024 * 1024 || read_all(buf, h + p) < 0) return 1;
    buf[h] = 0;
    const char *header = (const char *)buf;
    long id = field_int(header, "\"id\":");
    if (strstr(header, "\"t\":\"exec\"")) {
      exec_one(header, id);
      continue;
    }
    if (!strstr(header, "\"t\":\"limits\"")) continue;
    const char *cg = getenv("BOTHY_COMMANDS_CGROUP");
    if (cg) {
      char path[256];
      snprintf(path, sizeof path, "%s/pids.max", cg);
      FILE *f = fopen(path, "w");
      if (f) fputs("1024", f), fclose(f);
    }
    char done[64];
    snprintf(done, sizeof done, "{\"t\":\"done\",\"id\":%ld}", id);
    frame(done, "", 0);
  }
}
