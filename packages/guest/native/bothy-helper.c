/*
 * bothy-helper: what the guest agent needs that Node cannot do (no ioctl, no clock_settime), or
 * cannot do fast (a Node child_process.spawn costs ~95 ms inside gVisor). Built statically: by
 * the host when it makes the initramfs (QEMU), and beside the agent bundle (gVisor, bind-mounted).
 *
 *   bothy-helper reseed          credits the bytes on stdin (up to 512) to the kernel's input pool
 *                                and forces the CRNG to reseed now: after a memory snapshot is
 *                                restored, every clone would otherwise share the same RNG state.
 *   bothy-helper settime S NS    sets CLOCK_REALTIME: a restored clock is the snapshot's clock.
 *   bothy-helper identity S NS   both, in one process: spawning is slow under emulation.
 *   bothy-helper growroot DEV B  waits (up to 30 s) until the block device DEV holds at least B
 *                                bytes (the guest learns of a disk the host grew a moment later),
 *                                then grows the ext4 file system mounted at / to fill it, online.
 *   bothy-helper spawner PATH [--control]
 *                                stays resident and starts the agent's commands (see spawner.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/random.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

static int reseed(void) {
  struct { struct rand_pool_info info; unsigned char buf[512]; } req;
  ssize_t n = 0;
  while ((size_t)n < sizeof req.buf) {
    ssize_t r = read(0, req.buf + n, sizeof req.buf - (size_t)n);
    if (r < 0) { if (errno == EINTR) continue; perror("read"); return 1; }
    if (r == 0) break;
    n += r;
  }
  if (n < 32) { fprintf(stderr, "reseed: need at least 32 bytes on stdin, got %zd\n", n); return 1; }
  int fd = open("/dev/urandom", O_RDWR);
  if (fd < 0) { perror("open /dev/urandom"); return 1; }
  req.info.entropy_count = (int)n * 8;
  req.info.buf_size = (int)n;
  if (ioctl(fd, RNDADDENTROPY, &req.info) < 0) { perror("RNDADDENTROPY"); return 1; }
  if (ioctl(fd, RNDRESEEDCRNG) < 0) { perror("RNDRESEEDCRNG"); return 1; }
  close(fd);
  return 0;
}

static int settime(const char *s, const char *ns) {
  struct timespec ts = { .tv_sec = strtoll(s, NULL, 10), .tv_nsec = strtol(ns, NULL, 10) };
  if (clock_settime(CLOCK_REALTIME, &ts) < 0) { perror("clock_settime"); return 1; }
  return 0;
}

#ifndef EXT4_IOC_RESIZE_FS
#define EXT4_IOC_RESIZE_FS _IOW('f', 16, unsigned long long)
#endif

static int growroot(const char *dev, const char *bytes) {
  unsigned long long want = strtoull(bytes, NULL, 10), size = 0;
  int fd = open(dev, O_RDONLY | O_CLOEXEC);
  if (fd < 0) { perror(dev); return 1; }
  for (int i = 0; i < 600; i++) {
    if (ioctl(fd, BLKGETSIZE64, &size) < 0) { perror("BLKGETSIZE64"); return 1; }
    if (size >= want) break;
    usleep(50 * 1000);
  }
  close(fd);
  if (size < want) { fprintf(stderr, "growroot: %s holds %llu bytes, not the %llu the host gave it\n", dev, size, want); return 1; }
  struct statvfs st;
  if (statvfs("/", &st) < 0) { perror("statvfs /"); return 1; }
  unsigned long long blocks = size / st.f_frsize;
  int root = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) { perror("open /"); return 1; }
  /* The kernel grows a mounted ext4 in place; the same size again is nothing to do. */
  if (ioctl(root, EXT4_IOC_RESIZE_FS, &blocks) < 0) { perror("EXT4_IOC_RESIZE_FS"); return 1; }
  close(root);
  return 0;
}

int spawner(const char *name, int control);

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "spawner") == 0) return spawner(argv[2], 0);
  if (argc == 4 && strcmp(argv[1], "spawner") == 0 && strcmp(argv[3], "--control") == 0) return spawner(argv[2], 1);
  if (argc == 2 && strcmp(argv[1], "reseed") == 0) return reseed();
  if (argc == 4 && strcmp(argv[1], "settime") == 0) return settime(argv[2], argv[3]);
  if (argc == 4 && strcmp(argv[1], "identity") == 0) return reseed() || settime(argv[2], argv[3]);
  if (argc == 4 && strcmp(argv[1], "growroot") == 0) return growroot(argv[2], argv[3]);
  fprintf(stderr, "usage: bothy-helper reseed | settime SECONDS NANOSECONDS | identity SECONDS NANOSECONDS | growroot DEVICE BYTES | spawner PATH [--control]\n");
  return 2;
}
