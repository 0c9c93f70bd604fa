/*
 * bothy-helper spawner PATH: starts the guest agent's commands, so that a command costs one fork
 * of this small static process and one exec, not a Node child_process.spawn (~95 ms in gVisor).
 *
 * The agent starts it once and talks to it over its stdin and stdout; the agent keeps the
 * protocol, flow control and signals. A command's stdio are not pipes but unix stream
 * connections the agent itself made to the unix socket PATH (a file: Node 18 cannot connect to
 * an abstract name): each starts with a fixed hello
 * (token, command number, fd) and is then handed to the child as that fd, so its bytes go
 * straight between the command and the agent's net.Socket (Node reads sockets natively; it cannot
 * receive fds over SCM_RIGHTS), with the kernel's own backpressure and nothing relayed here.
 *
 * Requests on stdin: u32le length, then NUL-terminated fields:
 *   token TOKEN            first: the secret each stream's hello must carry (only the agent knows it)
 *   spawn SEQ FLAGS CGROUP CWD ARGC ARGV... ENV...
 *                          FLAGS: 1 stdin is a stream (else /dev/null), 2 set oom_score_adj to 0,
 *                          4 no output streams (stdout and stderr are /dev/null);
 *                          CGROUP: a cgroup directory the child joins before exec ("" for none),
 *                          as the commands' process limit requires: a child that cannot join
 *                          says so on its stderr and exits 126, never runs unlimited.
 * Answers on stdout, one line each of three numbers after a word: `ready 0 0 0` once listening,
 * `started SEQ PID 0`, `failed SEQ STEP ERRNO` (STEP 1 chdir, 2 exec: nothing ran), `exited SEQ
 * CODE SIGNAL` (CODE -1 when killed by SIGNAL, else SIGNAL 0).
 * The child runs in a session (and process group) of its own with default signal handling. It
 * exits when its stdin ends (the agent is gone); commands run on, as their own processes.
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
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOKEN_LEN 32
/* "TOKEN SEQ(10) FD\n" */
#define HELLO_LEN (TOKEN_LEN + 1 + 10 + 1 + 1 + 1)
#define MAX_REQUEST (4u << 20)
#define F_STDIN 1u
#define F_OOM_ADJ 2u
#define F_QUIET 4u

struct cmd {
  struct cmd *next;
  unsigned seq;
  char *req;     /* the spawn request's fields, owned */
  size_t req_len;
  int fds[3];    /* streams by fd number; -1 until connected */
  pid_t pid;     /* 0 until forked */
  int errpipe;   /* read end while the exec is pending, else -1 */
  int started;
};

static struct cmd *cmds;
static char token[TOKEN_LEN + 1];
static int sigpipe_fds[2];

static void on_sigchld(int sig) {
  (void)sig;
  int saved = errno;
  ssize_t r = write(sigpipe_fds[1], "c", 1);
  (void)r;
  errno = saved;
}

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

static struct cmd *find(unsigned seq, int create) {
  for (struct cmd *c = cmds; c; c = c->next)
    if (c->seq == seq && c->pid == 0) return c;
  if (!create) return NULL;
  struct cmd *c = calloc(1, sizeof *c);
  if (!c) { perror("bothy-helper: calloc"); exit(1); }
  c->seq = seq;
  c->fds[0] = c->fds[1] = c->fds[2] = -1;
  c->errpipe = -1;
  c->next = cmds;
  cmds = c;
  return c;
}

static void drop(struct cmd *c) {
  for (struct cmd **p = &cmds; *p; p = &(*p)->next)
    if (*p == c) { *p = c->next; break; }
  for (int i = 0; i < 3; i++) if (c->fds[i] >= 0) close(c->fds[i]);
  if (c->errpipe >= 0) close(c->errpipe);
  free(c->req);
  free(c);
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

static void child_fail(int errpipe, int step) {
  int msg[2] = { step, errno };
  ssize_t r = write(errpipe, msg, sizeof msg);
  (void)r;
  _exit(127);
}

/* What the child needs, all prepared by the parent: the child shares its memory (see launch). */
struct launch {
  int errpipe, in, out, err;
  unsigned flags;
  const char *cgroup_procs, *cwd;
  char **argv, **env;
};

/* In the child: only system calls from here to the exec, no heap. Never returns. */
static int exec_child(void *arg) {
  struct launch *l = arg;
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  setsid();
  int in = l->in >= 0 ? l->in : open("/dev/null", O_RDONLY);
  int out = l->out >= 0 ? l->out : open("/dev/null", O_WRONLY);
  int err = l->err >= 0 ? l->err : out;
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) child_fail(l->errpipe, 2);
  if (l->cgroup_procs) {
    char pid[24];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    int fd = open(l->cgroup_procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, pid, strlen(pid)) < 0) {
      write_all(2, "bothy: this command could not join the sandbox's process-limited cgroup\n");
      _exit(126);
    }
    close(fd);
  }
  if (l->flags & F_OOM_ADJ) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) { write_all(fd, "0"); close(fd); }
  }
  if (chdir(l->cwd) < 0) child_fail(l->errpipe, 1);
  execve(l->argv[0], l->argv, l->env);
  child_fail(l->errpipe, 2);
  return 127;
}

/* The child's stack: one at a time, since the parent waits for each child's exec (CLONE_VFORK). */
static char child_stack[64 * 1024] __attribute__((aligned(16)));

/*
 * Starts the command once the request and every stream it needs are there. The child shares
 * this process's memory until its exec (CLONE_VM | CLONE_VFORK, as posix_spawn does): no copy
 * of an address space to make, which inside gVisor is most of what a fork costs.
 */
static void maybe_launch(struct cmd *c) {
  if (!c->req) return;
  char **f = malloc(sizeof(char *) * (c->req_len + 2));
  if (!f) { perror("bothy-helper: malloc"); exit(1); }
  int n = fields(c->req, c->req_len, f, (int)c->req_len + 1);
  unsigned flags = n >= 3 ? (unsigned)strtoul(f[2], NULL, 10) : 0;
  int argc = n >= 6 ? atoi(f[5]) : 0;
  if ((!(flags & F_QUIET) && (c->fds[1] < 0 || c->fds[2] < 0)) || ((flags & F_STDIN) && c->fds[0] < 0)) {
    free(f);
    return;
  }
  if (argc < 1 || 6 + argc > n) {
    say("failed %u %ld %ld\n", c->seq, 2, EINVAL);
    free(f);
    drop(c);
    return;
  }
  /* argv and env as NULL-terminated arrays: argv moves down one slot to make room for its NULL. */
  char **argv = f + 5;
  for (int i = 0; i < argc; i++) argv[i] = f[6 + i];
  argv[argc] = NULL;
  f[n] = NULL;
  char procs[4096];
  snprintf(procs, sizeof procs, "%s/cgroup.procs", f[3]);
  struct launch l = {
    .in = (flags & F_STDIN) ? c->fds[0] : -1,
    .out = (flags & F_QUIET) ? -1 : c->fds[1],
    .err = (flags & F_QUIET) ? -1 : c->fds[2],
    .flags = flags,
    .cgroup_procs = f[3][0] ? procs : NULL,
    .cwd = f[4],
    .argv = argv,
    .env = f + 6 + argc,
  };
  int ep[2];
  if (pipe2(ep, O_CLOEXEC) < 0) {
    say("failed %u %ld %ld\n", c->seq, 2, errno);
    free(f);
    drop(c);
    return;
  }
  l.errpipe = ep[1];
  pid_t pid = clone(exec_child, child_stack + sizeof child_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &l);
  int clone_errno = errno;
  close(ep[1]);
  free(f);
  if (pid < 0) {
    say("failed %u %ld %ld\n", c->seq, 2, clone_errno);
    close(ep[0]);
    drop(c);
    return;
  }
  c->pid = pid;
  c->errpipe = ep[0];
  for (int i = 0; i < 3; i++) if (c->fds[i] >= 0) { close(c->fds[i]); c->fds[i] = -1; }
  free(c->req);
  c->req = NULL;
}

/* The exec's outcome: EOF on the CLOEXEC pipe means it happened. */
static void exec_outcome(struct cmd *c) {
  int msg[2];
  ssize_t r;
  do r = read(c->errpipe, msg, sizeof msg); while (r < 0 && errno == EINTR);
  close(c->errpipe);
  c->errpipe = -1;
  if (r == (ssize_t)sizeof msg) {
    say("failed %u %ld %ld\n", c->seq, msg[0], msg[1]);
    c->started = -1; /* its exit is not reported */
  } else {
    say("started %u %ld %ld\n", c->seq, (long)c->pid, 0);
    c->started = 1;
  }
}

static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (struct cmd *c = cmds; c; c = c->next) {
      if (c->pid != pid) continue;
      if (c->errpipe >= 0) exec_outcome(c);
      if (c->started == 1) {
        if (WIFSIGNALED(status)) say("exited %u %ld %ld\n", c->seq, -1, WTERMSIG(status));
        else say("exited %u %ld %ld\n", c->seq, WEXITSTATUS(status), 0);
      }
      drop(c);
      break;
    }
  }
}

static void on_request(char *buf, size_t len) {
  char *f[3];
  int n = fields(buf, len, f, 3);
  if (n >= 2 && strcmp(f[0], "token") == 0) {
    snprintf(token, sizeof token, "%s", f[1]);
    return;
  }
  if (n < 3 || strcmp(f[0], "spawn") != 0) return;
  struct cmd *c = find((unsigned)strtoul(f[1], NULL, 10), 1);
  free(c->req);
  c->req = malloc(len);
  if (!c->req) { perror("bothy-helper: malloc"); exit(1); }
  memcpy(c->req, buf, len);
  c->req_len = len;
  maybe_launch(c);
}

/* A new stream: its hello names the command and fd; anything else is refused. */
static void on_stream(int fd) {
  char hello[HELLO_LEN + 1];
  size_t got = 0;
  struct timeval tv = { .tv_sec = 2 };
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  while (got < HELLO_LEN) {
    ssize_t r = read(fd, hello + got, HELLO_LEN - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) { close(fd); return; }
    got += (size_t)r;
  }
  struct timeval none = { 0 };
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  hello[HELLO_LEN] = '\0';
  unsigned seq, which;
  if (token[0] == '\0' || memcmp(hello, token, TOKEN_LEN) != 0 || hello[TOKEN_LEN] != ' ' ||
      sscanf(hello + TOKEN_LEN + 1, "%10u %1u", &seq, &which) != 2 || which > 2) {
    close(fd);
    return;
  }
  struct cmd *c = find(seq, 1);
  if (c->fds[which] >= 0) close(c->fds[which]);
  c->fds[which] = fd;
  maybe_launch(c);
}

static const char *socket_path;

static void unlink_socket(void) {
  unlink(socket_path);
}

int spawner(const char *path) {
  signal(SIGPIPE, SIG_IGN);
  if (pipe2(sigpipe_fds, O_CLOEXEC | O_NONBLOCK) < 0) return perror("bothy-helper: pipe"), 1;
  struct sigaction sa = { .sa_handler = on_sigchld, .sa_flags = SA_RESTART | SA_NOCLDSTOP };
  sigaction(SIGCHLD, &sa, NULL);

  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) return perror("bothy-helper: socket"), 1;
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  if (strlen(path) + 1 > sizeof addr.sun_path) return fprintf(stderr, "bothy-helper: socket path too long\n"), 1;
  strcpy(addr.sun_path, path);
  unlink(path); /* one an agent before this one left */
  if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0) return perror("bothy-helper: bind"), 1;
  socket_path = path;
  atexit(unlink_socket);
  if (listen(lfd, 256) < 0) return perror("bothy-helper: listen"), 1;
  say("ready %u %ld %ld\n", 0, 0, 0);

  char *in = NULL;
  size_t in_len = 0, in_cap = 0;
  struct pollfd *pfds = NULL;
  size_t pcap = 0;
  for (;;) {
    size_t n = 3;
    for (struct cmd *c = cmds; c; c = c->next) if (c->errpipe >= 0) n++;
    if (n > pcap) {
      pcap = n * 2;
      pfds = realloc(pfds, pcap * sizeof *pfds);
      if (!pfds) return perror("bothy-helper: realloc"), 1;
    }
    pfds[0] = (struct pollfd){ .fd = 0, .events = POLLIN };
    pfds[1] = (struct pollfd){ .fd = lfd, .events = POLLIN };
    pfds[2] = (struct pollfd){ .fd = sigpipe_fds[0], .events = POLLIN };
    size_t k = 3;
    for (struct cmd *c = cmds; c; c = c->next)
      if (c->errpipe >= 0) pfds[k++] = (struct pollfd){ .fd = c->errpipe, .events = POLLIN };
    if (poll(pfds, k, -1) < 0) {
      if (errno == EINTR) continue;
      return perror("bothy-helper: poll"), 1;
    }
    /* Exec outcomes first, so a command's `started` always comes before its `exited`. */
    for (size_t i = 3; i < k; i++) {
      if (!pfds[i].revents) continue;
      for (struct cmd *c = cmds; c; c = c->next)
        if (c->errpipe == pfds[i].fd) { exec_outcome(c); break; }
    }
    if (pfds[2].revents) {
      char drain[64];
      while (read(sigpipe_fds[0], drain, sizeof drain) > 0) {}
      reap();
    }
    /* Requests before new streams: the token comes first on stdin. */
    if (pfds[0].revents) {
      if (in_len + 65536 > in_cap) {
        in_cap = (in_len + 65536) * 2;
        in = realloc(in, in_cap);
        if (!in) return perror("bothy-helper: realloc"), 1;
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
    if (pfds[1].revents) {
      int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0) on_stream(fd);
    }
  }
}
