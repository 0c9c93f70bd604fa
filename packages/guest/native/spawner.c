/*
 * bothy-helper spawner PATH: starts the guest agent's commands, so that a command costs one fork
 * of this small static process and one exec, not a Node child_process.spawn (~95 ms in gVisor).
 * Under gVisor's ptrace platform every system call and every wakeup of a guest task costs tens of
 * microseconds, so a command's path here is kept to as few of both as it can be.
 *
 * The agent starts it once and talks to it over its stdin and stdout; the agent keeps the
 * protocol, flow control and signals. A command's stdio are not pipes but unix stream
 * connections the agent itself made to the unix socket PATH (a file: Node 18 cannot connect to
 * an abstract name), handed to the child as its fds, so its bytes go straight between the command
 * and the agent's net.Socket (Node reads sockets natively; it cannot receive fds over SCM_RIGHTS),
 * with the kernel's own backpressure and nothing relayed here.
 *
 * Streams: the agent connects a few ahead of need (spares), each starting with a fixed hello
 * "TOKEN ID\n" (ID: a stream number > 0, space-padded to 10 characters); the helper holds each,
 * unused, until a spawn request names it, so no connect, accept or hello is on a command's path.
 * Anything else on the socket is closed.
 *
 * Requests on stdin: u32le length, then NUL-terminated fields:
 *   token TOKEN            first: the secret each stream's hello must carry (only the agent knows it)
 *   spawn SEQ FLAGS CGROUP CWD IN OUT ERR ARGC ARGV... ENV...
 *                          IN, OUT, ERR: the stream that becomes fd 0, 1, 2, or 0 for /dev/null; a
 *                          request waits for a stream it names that has not arrived yet;
 *                          FLAGS: 1 set oom_score_adj to 0;
 *                          CGROUP: a cgroup directory the child joins before exec ("" for none),
 *                          as the commands' process limit requires: a child that cannot join
 *                          says so on its stderr and exits 126, never runs unlimited.
 * Answers on stdout, one line each of three numbers after a word: `ready 0 0 0` once listening,
 * `started SEQ PID 0` (once the exec happened), `failed SEQ STEP ERRNO` (STEP 1 chdir, 2 exec:
 * nothing ran), `exited SEQ CODE SIGNAL` (CODE -1 when killed by SIGNAL, else SIGNAL 0).
 * The child runs in a session (and process group) of its own with default signal handling. The
 * helper exits when its stdin ends (the agent is gone); commands run on, as their own processes.
 *
 * With `--control` (gVisor: bothy-init starts the helper beside the agent, so it is up by the
 * time the agent has loaded, not ~40 ms of a Node child_process.spawn later), fd 0 is a
 * listening unix socket bothy-init made before it started the agent; the first connection on it
 * is the agent's (see accept_control), and carries the requests and answers in place of stdin
 * and stdout.
 *
 * The helper sets every signal's handling to the default once, at its start, and installs no
 * handler (SIGCHLD arrives on a signalfd, SIGPIPE is blocked), so a child needs one sigprocmask
 * before its exec, not a reset of every signal.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOKEN_LEN 32
/* "TOKEN ID(10)\n" */
#define HELLO_LEN (TOKEN_LEN + 1 + 10 + 1)
#define MAX_REQUEST (4u << 20)
/* Connections still owing their hello; more are refused until those have said it or gone. */
#define MAX_UNGREETED 64
#define F_OOM_ADJ 1u
/* The request's fixed fields before ARGV. */
#define FIXED_FIELDS 9

/* An accepted connection: id 0 until its hello has come. */
struct stream {
  struct stream *next;
  unsigned id;
  int fd;
  size_t got;
  char hello[HELLO_LEN];
};

/* A spawn request waiting for the streams it names. */
struct request {
  struct request *next;
  unsigned seq;
  unsigned want[3];
  char *buf; /* its fields, owned */
  size_t len;
};

/* A started command, until it is reaped. */
struct child {
  struct child *next;
  unsigned seq;
  pid_t pid;
};

static struct stream *streams;
static struct request *waiting;
static struct child *children;
static char token[TOKEN_LEN + 1];
static int devnull = -1;
/* The cgroup.procs file of the cgroup joined last, kept open: commands mostly share one. */
static char *cgroup_dir;
static int cgroup_fd = -1;

static void say(const char *fmt, unsigned seq, long a, long b) {
  char line[96];
  int n = snprintf(line, sizeof line, fmt, seq, a, b);
  for (int off = 0; off < n;) {
    ssize_t w = write(1, line + off, (size_t)(n - off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) exit(0); /* the agent is gone */
    off += (int)w;
  }
}

static void *must(void *p) {
  if (!p) { perror("bothy-helper: out of memory"); exit(1); }
  return p;
}

/* Splits a request's fields; returns how many (at most max). */
static int fields(char *buf, size_t len, char **out, int max) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; i < len && n < max; i++)
    if (buf[i] == '\0') { out[n++] = buf + start; start = i + 1; }
  return n;
}

static void write_all(int fd, const char *s) {
  size_t len = strlen(s);
  while (len > 0) {
    ssize_t w = write(fd, s, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    len -= (size_t)w;
  }
}

/* What the child needs, all prepared by the parent: the child shares its memory (see launch). */
struct launch {
  int in, out, err;
  unsigned flags;
  int join;      /* whether to join a cgroup; through cgroup_fd, which is -1 if it cannot */
  int cgroup_fd;
  const char *cwd;
  char **argv, **env;
  /* Set by the child when it fails before its exec; read by the parent once clone returns. */
  volatile int fail_step, fail_errno;
};

static _Noreturn void child_fail(struct launch *l, int step) {
  l->fail_errno = errno;
  l->fail_step = step;
  _exit(127);
}

/* In the child: only system calls from here to the exec, no heap. Never returns. */
static int exec_child(void *arg) {
  struct launch *l = arg;
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  setsid();
  if (dup2(l->in, 0) < 0 || dup2(l->out, 1) < 0 || dup2(l->err, 2) < 0) child_fail(l, 2);
  if (l->join) {
    char pid[24];
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (l->cgroup_fd < 0 || pwrite(l->cgroup_fd, pid, (size_t)n, 0) < 0) {
      write_all(2, "bothy: this command could not join the sandbox's process-limited cgroup\n");
      _exit(126);
    }
  }
  if (l->flags & F_OOM_ADJ) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) { write_all(fd, "0"); close(fd); }
  }
  if (chdir(l->cwd) < 0) child_fail(l, 1);
  execve(l->argv[0], l->argv, l->env);
  child_fail(l, 2);
}

/* The child's stack: one at a time, since the parent waits for each child's exec (CLONE_VFORK). */
static char child_stack[64 * 1024] __attribute__((aligned(16)));

/* The cgroup.procs of DIR, opened once for as long as commands keep joining DIR. */
static int cgroup_procs(const char *dir) {
  if (cgroup_dir && strcmp(cgroup_dir, dir) == 0 && cgroup_fd >= 0) return cgroup_fd;
  if (cgroup_fd >= 0) close(cgroup_fd);
  free(cgroup_dir);
  cgroup_dir = must(strdup(dir));
  char path[4096];
  snprintf(path, sizeof path, "%s/cgroup.procs", dir);
  cgroup_fd = open(path, O_WRONLY | O_CLOEXEC);
  return cgroup_fd;
}

static struct stream **find_stream(unsigned id) {
  for (struct stream **p = &streams; *p; p = &(*p)->next)
    if ((*p)->id == id) return p;
  return NULL;
}

/* Takes a greeted stream out of the list; returns its fd (devnull for id 0). */
static int take_stream(unsigned id) {
  if (id == 0) return devnull;
  struct stream **p = find_stream(id);
  struct stream *s = *p;
  int fd = s->fd;
  *p = s->next;
  free(s);
  return fd;
}

/* Whether every stream the request names has arrived. */
static int streams_ready(const struct request *r) {
  for (int i = 0; i < 3; i++)
    if (r->want[i] != 0 && !find_stream(r->want[i])) return 0;
  return 1;
}

/*
 * Starts the command. The child shares this process's memory until its exec (CLONE_VM |
 * CLONE_VFORK, as posix_spawn does): no copy of an address space to make, which inside gVisor is
 * most of what a fork costs, and when clone returns the child has exec'd or failed, so `started`
 * (or `failed`) is known at once, with no pipe to wait on.
 */
static void launch(struct request *r) {
  int fds[3];
  for (int i = 0; i < 3; i++) fds[i] = take_stream(r->want[i]);
  char **f = must(malloc(sizeof(char *) * (r->len + 2)));
  int n = fields(r->buf, r->len, f, (int)r->len + 1);
  int argc = n >= FIXED_FIELDS ? atoi(f[FIXED_FIELDS - 1]) : 0;
  if (argc < 1 || FIXED_FIELDS + argc > n) {
    say("failed %u %ld %ld\n", r->seq, 2, EINVAL);
  } else {
    /* argv and env as NULL-terminated arrays: argv moves down one slot to make room for its NULL. */
    char **argv = f + FIXED_FIELDS - 1;
    for (int i = 0; i < argc; i++) argv[i] = f[FIXED_FIELDS + i];
    argv[argc] = NULL;
    f[n] = NULL;
    struct launch l = {
      .in = fds[0],
      .out = fds[1],
      .err = fds[2],
      .flags = (unsigned)strtoul(f[2], NULL, 10),
      .join = f[3][0] != '\0',
      .cgroup_fd = f[3][0] != '\0' ? cgroup_procs(f[3]) : -1,
      .cwd = f[4],
      .argv = argv,
      .env = f + FIXED_FIELDS + argc,
    };
    pid_t pid = clone(exec_child, child_stack + sizeof child_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &l);
    if (pid < 0) {
      say("failed %u %ld %ld\n", r->seq, 2, errno);
    } else if (l.fail_step != 0) {
      say("failed %u %ld %ld\n", r->seq, l.fail_step, l.fail_errno); /* its exit is not reported */
    } else {
      struct child *c = must(calloc(1, sizeof *c));
      c->seq = r->seq;
      c->pid = pid;
      c->next = children;
      children = c;
      say("started %u %ld %ld\n", r->seq, (long)pid, 0);
    }
  }
  for (int i = 0; i < 3; i++) if (fds[i] != devnull) close(fds[i]);
  free(f);
}

/* Launches the waiting requests whose streams have all arrived, in the order they came. */
static void launch_ready(void) {
  for (struct request **p = &waiting; *p;) {
    struct request *r = *p;
    if (!streams_ready(r)) { p = &r->next; continue; }
    *p = r->next;
    launch(r);
    free(r->buf);
    free(r);
  }
}

static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (struct child **p = &children; *p; p = &(*p)->next) {
      struct child *c = *p;
      if (c->pid != pid) continue;
      if (WIFSIGNALED(status)) say("exited %u %ld %ld\n", c->seq, -1, WTERMSIG(status));
      else say("exited %u %ld %ld\n", c->seq, WEXITSTATUS(status), 0);
      *p = c->next;
      free(c);
      break;
    }
  }
}

static void on_request(char *buf, size_t len) {
  char *f[FIXED_FIELDS];
  int n = fields(buf, len, f, FIXED_FIELDS);
  if (n >= 2 && strcmp(f[0], "token") == 0) {
    snprintf(token, sizeof token, "%s", f[1]);
    return;
  }
  if (n < FIXED_FIELDS || strcmp(f[0], "spawn") != 0) return;
  struct request *r = must(calloc(1, sizeof *r));
  r->seq = (unsigned)strtoul(f[1], NULL, 10);
  for (int i = 0; i < 3; i++) r->want[i] = (unsigned)strtoul(f[5 + i], NULL, 10);
  r->buf = must(malloc(len));
  memcpy(r->buf, buf, len);
  r->len = len;
  struct request **tail = &waiting;
  while (*tail) tail = &(*tail)->next;
  *tail = r;
}

static void drop_stream(struct stream **p) {
  struct stream *s = *p;
  *p = s->next;
  close(s->fd);
  free(s);
}

/* Reads what has come of a stream's hello; returns 0 if the stream was closed. */
static int greet(struct stream **p) {
  struct stream *s = *p;
  ssize_t r;
  do r = recv(s->fd, s->hello + s->got, HELLO_LEN - s->got, MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
  if (r <= 0) return drop_stream(p), 0;
  s->got += (size_t)r;
  if (s->got < HELLO_LEN) return 1;
  char id[11];
  memcpy(id, s->hello + TOKEN_LEN + 1, 10);
  id[10] = '\0';
  char *end;
  unsigned long n = strtoul(id, &end, 10);
  if (token[0] == '\0' || memcmp(s->hello, token, TOKEN_LEN) != 0 || s->hello[TOKEN_LEN] != ' ' ||
      s->hello[HELLO_LEN - 1] != '\n' || *end != '\0' || n == 0 || n > UINT32_MAX || find_stream((unsigned)n))
    return drop_stream(p), 0;
  s->id = (unsigned)n;
  return 1;
}

static size_t ungreeted(void) {
  size_t n = 0;
  for (struct stream *s = streams; s; s = s->next) if (s->id == 0) n++;
  return n;
}

/* New connections: each is greeted at once (the agent sends its hello with the connect). */
static void accept_streams(int lfd) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return; /* EAGAIN: none left (the listening socket is non-blocking) */
    if (ungreeted() >= MAX_UNGREETED) { close(fd); continue; }
    struct stream *s = must(calloc(1, sizeof *s));
    s->fd = fd;
    s->next = streams;
    streams = s;
    greet(&streams);
  }
}

static const char *socket_path;

/*
 * Takes the agent's connection from the listening socket on fd 0 and makes it fd 0 and fd 1. The
 * first connection is the agent's: nothing else runs in the sandbox before the agent connects
 * (its connect is made as it starts, before its boot hooks or any command), and the listener is
 * closed right after. (SO_PEERCRED cannot tell: this gVisor reports the accepting task's pid.)
 */
static int accept_control(void) {
  for (;;) {
    int fd = accept4(0, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return perror("bothy-helper: accept control"), -1;
    }
    struct sockaddr_un addr;
    socklen_t alen = sizeof addr;
    memset(&addr, 0, sizeof addr);
    if (getsockname(0, (struct sockaddr *)&addr, &alen) == 0 && addr.sun_path[0] && !addr.sun_path[sizeof addr.sun_path - 1])
      unlink(addr.sun_path); /* nothing else may connect; the file is of no more use */
    if (dup2(fd, 0) < 0 || dup2(fd, 1) < 0) return perror("bothy-helper: dup2 control"), -1;
    close(fd);
    return 0;
  }
}

static void unlink_socket(void) {
  unlink(socket_path);
}

int spawner(const char *path, int control) {
  /* Default handling everywhere, once, for the children (an ignored signal outlives an exec). */
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  /* SIGCHLD is read from a signalfd; SIGPIPE is blocked, so a write to a gone agent is EPIPE. */
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGPIPE);
  if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0) return perror("bothy-helper: sigprocmask"), 1;
  sigdelset(&mask, SIGPIPE);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return perror("bothy-helper: signalfd"), 1;
  devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) return perror("bothy-helper: /dev/null"), 1;

  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0) return perror("bothy-helper: socket"), 1;
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  if (strlen(path) + 1 > sizeof addr.sun_path) return fprintf(stderr, "bothy-helper: socket path too long\n"), 1;
  strcpy(addr.sun_path, path);
  unlink(path); /* one an agent before this one left */
  if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0) return perror("bothy-helper: bind"), 1;
  socket_path = path;
  atexit(unlink_socket);
  if (listen(lfd, 256) < 0) return perror("bothy-helper: listen"), 1;
  if (control && accept_control() < 0) return 1;
  say("ready %u %ld %ld\n", 0, 0, 0);

  char *in = NULL;
  size_t in_len = 0, in_cap = 0;
  struct pollfd *pfds = NULL;
  size_t pcap = 0;
  for (;;) {
    size_t n = 3 + ungreeted();
    if (n > pcap) {
      pcap = n * 2;
      pfds = must(realloc(pfds, pcap * sizeof *pfds));
    }
    pfds[0] = (struct pollfd){ .fd = 0, .events = POLLIN };
    pfds[1] = (struct pollfd){ .fd = lfd, .events = POLLIN };
    pfds[2] = (struct pollfd){ .fd = sfd, .events = POLLIN };
    size_t k = 3;
    for (struct stream *s = streams; s; s = s->next)
      if (s->id == 0) pfds[k++] = (struct pollfd){ .fd = s->fd, .events = POLLIN };
    if (poll(pfds, k, -1) < 0) {
      if (errno == EINTR) continue;
      return perror("bothy-helper: poll"), 1;
    }
    if (pfds[2].revents) {
      struct signalfd_siginfo info[8];
      while (read(sfd, info, sizeof info) > 0) {}
      reap();
    }
    /* Requests before new streams: the token comes first on stdin. */
    if (pfds[0].revents) {
      if (in_len + 65536 > in_cap) {
        in_cap = (in_len + 65536) * 2;
        in = must(realloc(in, in_cap));
      }
      ssize_t r = read(0, in + in_len, in_cap - in_len);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return 0; /* the agent is gone */
      in_len += (size_t)r;
      size_t off = 0;
      while (in_len - off >= 4) {
        uint32_t len = (uint32_t)(unsigned char)in[off] | (uint32_t)(unsigned char)in[off + 1] << 8 |
                       (uint32_t)(unsigned char)in[off + 2] << 16 | (uint32_t)(unsigned char)in[off + 3] << 24;
        if (len > MAX_REQUEST) { fprintf(stderr, "bothy-helper: request of %u bytes refused\n", len); return 1; }
        if (in_len - off - 4 < len) break;
        on_request(in + off + 4, len);
        off += 4 + len;
      }
      memmove(in, in + off, in_len - off);
      in_len -= off;
    }
    for (size_t i = 3; i < k; i++) {
      if (!pfds[i].revents) continue;
      for (struct stream **p = &streams; *p; p = &(*p)->next)
        if ((*p)->fd == pfds[i].fd) { greet(p); break; }
    }
    if (pfds[1].revents) accept_streams(lfd);
    launch_ready();
  }
}
