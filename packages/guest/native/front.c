/*
 * bothy-init's native front: bothy-init itself holds the host's channel (fds 0 and 1) and answers
 * what every boot needs, so a sandbox's Node does not start at boot (docs/performance.md, "Where a
 * cold boot's CPU goes": Node was half of a boot's CPU). Native: the hello, repeated until its
 * `hello_ack`, `resync`, and `limits` (the commands' pids.max). Everything else goes to the Node
 * agent, started on the first frame that needs it, once, over two pipes: its hello is answered
 * here and not passed on, its frames go to the host whole, between the front's own.
 *
 * The native side reads a strict subset of the protocol (frames.c frame_classify): a frame it
 * does not fully understand is Node's, whose zod schemas answer it as they always did, so the
 * front can only ever accept less than Node would.
 *
 * While Node starts, its frames wait in a bounded queue; a start that fails, or that has not said
 * hello by NODE_START_MS, answers every waiting request with an error, never a hang (an `exec`
 * also with `exited`, which its host waits for). A Node that has started ends the sandbox when it
 * exits, as it did when it was PID 1's only child.
 *
 * Backpressure: the host's input is not read while too much waits for Node or for the host, and
 * Node's output is not read while too much waits for the host, so Node sees its pipe congested
 * and pauses its commands as it did on the host's channel itself.
 */
#define _GNU_SOURCE
#include "front.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent-start.h"
#include "frames.h"

/* The host may not be listening yet: hello again until it answers (agent.ts HELLO_REPEAT_MS). */
#define HELLO_REPEAT_MS 200
/* How long Node may take to say hello once started on demand (gVisor under load: seconds). */
#define NODE_START_MS 60000
/* Bytes waiting for Node (or for the host) beyond which the host's input is not read. */
#define TO_NODE_MAX (2u * MAX_FRAME)
#define TO_HOST_MAX (256u * 1024)
/* After Node exits, how long its last frames may take to reach the host. */
#define FLUSH_MS 2000
#define BOOT_HOOKS_DIR "/etc/bothy/boot.d"

/* A frame on its way out, whole. */
struct out_frame {
  struct out_frame *next;
  size_t len, off;
  long long id;  /* for Node's frames: the request id to answer if Node does not start */
  int is_exec;
  unsigned char data[];
};

struct queue {
  struct out_frame *head, *tail;
  size_t bytes;
};

enum node_state { NODE_NONE, NODE_STARTING, NODE_UP };

static const struct front_options *opt;
static struct frame_reader host_in, node_in;
static struct queue to_host, to_node;
static int acked;
/* Boot hooks: the front's hello waits for Node's, which comes once they have run. */
static int hello_waits;
static long long next_hello;
static enum node_state node;
static pid_t node_pid, helper_pid;
static int node_w = -1, node_r = -1;
static long long node_deadline; /* 0: none */
/* After a resync: Node's frames belong to the host that is gone until Node's next hello. */
static int node_stale;
static char **fallback;
/* Set once the sandbox is ending: the status to return once the host has what it is owed. */
static int ending = -1;
static long long ending_deadline;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *must(void *p) {
  if (!p) {
    fputs("bothy-init: out of memory\n", stderr);
    exit(1);
  }
  return p;
}

static void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static struct out_frame *frame_copy(const void *data, size_t len) {
  struct out_frame *f = must(malloc(sizeof *f + len));
  *f = (struct out_frame){ .len = len };
  memcpy(f->data, data, len);
  return f;
}

static void push(struct queue *q, struct out_frame *f) {
  if (q->tail) q->tail->next = f;
  else q->head = f;
  q->tail = f;
  q->bytes += f->len;
}

/* Ahead of everything not yet begun (a frame half written stays first: frames go whole). */
static void push_first(struct queue *q, struct out_frame *f) {
  if (!q->head || q->head->off == 0) {
    f->next = q->head;
    q->head = f;
    if (!q->tail) q->tail = f;
  } else {
    f->next = q->head->next;
    q->head->next = f;
    if (q->tail == q->head) q->tail = f;
  }
  q->bytes += f->len;
}

static struct out_frame *pop(struct queue *q) {
  struct out_frame *f = q->head;
  if (!f) return NULL;
  q->head = f->next;
  if (!q->head) q->tail = NULL;
  q->bytes -= f->len;
  return f;
}

static void clear(struct queue *q) {
  for (struct out_frame *f; (f = pop(q));) free(f);
}

/* A header-only frame the front makes (header: JSON of at most 4 KiB). */
static struct out_frame *own_frame(const char *header) {
  size_t n = strlen(header);
  struct out_frame *f = must(malloc(sizeof *f + FRAME_PREFIX + n));
  *f = (struct out_frame){ .len = FRAME_PREFIX + n };
  frame_prefix(f->data, (uint32_t)n, 0);
  memcpy(f->data + FRAME_PREFIX, header, n);
  return f;
}

/* Writes what fd takes of the queue's frames; -1 when the reader is gone. */
static int drain(int fd, struct queue *q) {
  while (q->head) {
    struct out_frame *f = q->head;
    ssize_t w = write(fd, f->data + f->off, f->len - f->off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (w <= 0) return -1;
    f->off += (size_t)w;
    if (f->off < f->len) return 0;
    free(pop(q));
  }
  return 0;
}

static void hello(void) {
  char header[128];
  snprintf(header, sizeof header, "{\"t\":\"hello\",\"gen\":%d,\"agent\":\"bothy-init/0.1.0\",\"pid\":%d}",
           PROTOCOL_GENERATION, (int)getpid());
  push(&to_host, own_frame(header));
  next_hello = now_ms() + HELLO_REPEAT_MS;
}

/* An `error` frame for request `id` (0: none); `message` is the front's own ASCII, nothing quoted. */
static void send_error(long long id, const char *code, const char *message) {
  char header[768];
  if (id > 0)
    snprintf(header, sizeof header, "{\"t\":\"error\",\"id\":%lld,\"code\":\"%s\",\"message\":\"%s\"}", id, code, message);
  else
    snprintf(header, sizeof header, "{\"t\":\"error\",\"code\":\"%s\",\"message\":\"%s\"}", code, message);
  push(&to_host, own_frame(header));
}

/* The commands' process limit, as the Node agent's limits.ts wrote it. */
static void apply_limits(const struct host_frame *h) {
  char header[96], path[256], value[24];
  if (!opt->commands_cgroup) {
    send_error(h->id, "io_error",
               "limits: this guest has no pids cgroup for its commands, so their process limit cannot be enforced");
    return;
  }
  snprintf(path, sizeof path, "%s/pids.max", opt->commands_cgroup);
  int n = snprintf(value, sizeof value, "%lld", h->max_processes);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  int ok = fd >= 0 && write(fd, value, (size_t)n) == n;
  if (fd >= 0 && close(fd) < 0) ok = 0;
  if (!ok) {
    char message[384];
    snprintf(message, sizeof message, "limits: writing %s failed (errno %d)", path, errno);
    send_error(h->id, "io_error", message);
    return;
  }
  snprintf(header, sizeof header, "{\"t\":\"done\",\"id\":%lld}", h->id);
  push(&to_host, own_frame(header));
}

static void start_node(char **argv) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) < 0) return perror("bothy-init: pipe");
  if (pipe2(out, O_CLOEXEC) < 0) {
    perror("bothy-init: pipe");
    close(in[0]);
    close(in[1]);
    return;
  }
  node_pid = start_agent(argv, in[0], out[1], 1, &helper_pid);
  close(in[0]);
  close(out[1]);
  if (node_pid < 0) {
    node_pid = 0;
    close(in[1]);
    close(out[0]);
    return;
  }
  node_w = in[1];
  node_r = out[0];
  set_nonblocking(node_w);
  set_nonblocking(node_r);
  node = NODE_STARTING;
  node_deadline = hello_waits ? 0 : now_ms() + NODE_START_MS;
}

static void close_node_fds(void) {
  if (node_w >= 0) close(node_w);
  if (node_r >= 0) close(node_r);
  node_w = node_r = -1;
  node_in.len = node_in.start = 0;
  node_in.hunting = 0;
}

/* Requests that expect no answer of their own (guest-frames.ts): dropped, not answered, on a failed start. */
static int expects_answer(const char *t) {
  static const char *const quiet[] = { "stdin", "signal", "resize", "credit", "cancel", "tcp_data", "file_chunk", "hello_ack" };
  for (size_t i = 0; i < sizeof quiet / sizeof *quiet; i++)
    if (strcmp(t, quiet[i]) == 0) return 0;
  return 1;
}

/* Node did not start: everything waiting for it is answered, and a later frame tries again. */
static void node_failed(const char *why) {
  fprintf(stderr, "bothy-init: the guest agent %s\n", why);
  if (node_pid > 0) kill(node_pid, SIGKILL);
  if (helper_pid > 0) kill(helper_pid, SIGKILL);
  node_pid = helper_pid = 0; /* reaped as orphans */
  close_node_fds();
  node = NODE_NONE;
  node_stale = 0;
  char message[192];
  snprintf(message, sizeof message, "the sandbox's guest agent %s; try again", why);
  for (struct out_frame *f; (f = pop(&to_node)); free(f)) {
    if (f->id == 0) continue;
    if (f->is_exec) {
      char header[96];
      send_error(f->id, "spawn_failed", message);
      snprintf(header, sizeof header, "{\"t\":\"exited\",\"id\":%lld,\"code\":127,\"signal\":null}", f->id);
      push(&to_host, own_frame(header));
    } else {
      send_error(f->id, "io_error", message);
    }
  }
  if (hello_waits) {
    hello_waits = 0;
    hello();
  }
}

/* A host frame for Node: queued (Node started if it is not), answered if Node cannot start. */
static void to_node_frame(const struct frame *fr, const struct host_frame *h) {
  if (node == NODE_NONE) start_node(opt->agent);
  struct out_frame *f = frame_copy(fr->raw, fr->raw_len);
  f->id = expects_answer(h->t) ? h->id : 0;
  f->is_exec = strcmp(h->t, "exec") == 0;
  push(&to_node, f);
  if (node == NODE_NONE) node_failed("could not be started");
}

static void on_host_frame(const struct frame *fr) {
  struct host_frame h;
  frame_classify(fr->header, fr->header_len, &h);
  switch (h.kind) {
    case FK_HELLO_ACK:
      acked = 1;
      return;
    case FK_RESYNC:
      /* A new host took over the stream: the old one's requests are over (agent.ts does the same). */
      if (node == NODE_UP) {
        push(&to_node, frame_copy(fr->raw, fr->raw_len));
        node_stale = 1;
      } else {
        clear(&to_node); /* Node has not seen them yet */
      }
      acked = 0;
      if (!hello_waits) hello();
      return;
    case FK_LIMITS:
      apply_limits(&h);
      return;
    case FK_OTHER:
      to_node_frame(fr, &h);
      return;
  }
}

/* Node's hello (JSON.stringify puts `t` first). */
static int is_hello(const struct frame *f) {
  static const char prefix[] = "{\"t\":\"hello\"";
  size_t n = sizeof prefix - 1;
  return f->header_len > n && memcmp(f->header, prefix, n) == 0 && (f->header[n] == ',' || f->header[n] == '}');
}

static void on_node_frame(const struct frame *f) {
  if (is_hello(f)) {
    char ack[64];
    snprintf(ack, sizeof ack, "{\"t\":\"hello_ack\",\"gen\":%d}", PROTOCOL_GENERATION);
    push_first(&to_node, own_frame(ack));
    node_stale = 0;
    node = NODE_UP;
    node_deadline = 0;
    if (hello_waits) {
      hello_waits = 0;
      hello();
    }
    return;
  }
  if (node_stale || node != NODE_UP) return;
  push(&to_host, frame_copy(f->raw, f->raw_len));
}

static void node_exited(int status) {
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  node_pid = 0;
  if (ending >= 0 || node == NODE_UP) {
    /* The sandbox ends with Node, as it did when Node was PID 1's only child, once its last frames are out. */
    ending = code;
    ending_deadline = now_ms() + FLUSH_MS;
    return;
  }
  if (node == NODE_STARTING) {
    if (fallback && WIFEXITED(status) && code == NOT_RUNNABLE) {
      fprintf(stderr, "bothy-init: %s could not run; starting the agent with %s\n", opt->agent[0], fallback[0]);
      if (helper_pid > 0) kill(helper_pid, SIGKILL); /* waiting for an agent that never ran */
      helper_pid = 0;
      close_node_fds();
      char **argv = fallback;
      fallback = NULL;
      start_node(argv);
      if (node_pid == 0) node_failed("could not be started");
      return;
    }
    char why[64];
    snprintf(why, sizeof why, "exited while starting (status %d)", code);
    node_failed(why);
  }
}

static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    if (pid == node_pid) node_exited(status);
    else if (pid == helper_pid) helper_pid = 0;
  }
}

/* SIGTERM and the like: to Node, which ends the sandbox by exiting; without Node, the end now. */
static int on_signal(int sig) {
  if (node_pid > 0) {
    kill(node_pid, sig);
    if (ending < 0) {
      ending = 128 + sig;
      ending_deadline = 0;
    }
    return -1;
  }
  return 128 + sig;
}

int front_has_boot_hooks(void) {
  DIR *d = opendir(BOOT_HOOKS_DIR);
  if (!d) return 0;
  int found = 0;
  for (struct dirent *e; !found && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", BOOT_HOOKS_DIR, e->d_name);
    found = access(path, X_OK) == 0;
  }
  closedir(d);
  return found;
}

int front_run(const struct front_options *opts) {
  opt = opts;
  fallback = opts->fallback;
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGPIPE); /* a write to a gone reader is EPIPE */
  if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0) return perror("bothy-init: sigprocmask"), 1;
  sigdelset(&mask, SIGPIPE);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return perror("bothy-init: signalfd"), 1;
  if (frame_reader_init(&host_in) < 0 || frame_reader_init(&node_in) < 0) return perror("bothy-init: mmap"), 1;
  set_nonblocking(0);
  set_nonblocking(1);
  int host_open = 1;

  if (opts->start_now) {
    hello_waits = 1;
    start_node(opts->agent);
    if (node == NODE_NONE) node_failed("could not be started");
  } else {
    hello();
  }

  for (;;) {
    long long now = now_ms();
    if (ending >= 0 && node_pid == 0 &&
        ((node_r < 0 && !to_host.head) || !host_open || (ending_deadline != 0 && now >= ending_deadline)))
      return ending;
    if (!acked && !hello_waits && ending < 0 && now >= next_hello) hello();
    if (node == NODE_STARTING && node_deadline != 0 && now >= node_deadline) {
      char why[64];
      snprintf(why, sizeof why, "did not start within %d s", NODE_START_MS / 1000);
      node_failed(why);
    }

    struct pollfd p[5] = {
      { .fd = sfd, .events = POLLIN },
      { .fd = host_open && ending < 0 && to_node.bytes < TO_NODE_MAX && to_host.bytes < TO_HOST_MAX ? 0 : -1, .events = POLLIN },
      { .fd = host_open && to_host.head ? 1 : -1, .events = POLLOUT },
      { .fd = node_r >= 0 && to_host.bytes < TO_HOST_MAX ? node_r : -1, .events = POLLIN },
      { .fd = node_w >= 0 && node == NODE_UP && to_node.head ? node_w : -1, .events = POLLOUT },
    };
    long long wake = -1;
    if (!acked && !hello_waits && ending < 0) wake = next_hello;
    if (node == NODE_STARTING && node_deadline != 0 && (wake < 0 || node_deadline < wake)) wake = node_deadline;
    if (ending >= 0 && ending_deadline != 0 && (wake < 0 || ending_deadline < wake)) wake = ending_deadline;
    int timeout = wake < 0 ? -1 : wake <= now ? 0 : (int)(wake - now);
    if (poll(p, 5, timeout) < 0) {
      if (errno == EINTR) continue;
      return perror("bothy-init: poll"), 1;
    }

    if (p[0].revents) {
      struct signalfd_siginfo info;
      while (read(sfd, &info, sizeof info) == sizeof info) {
        if (info.ssi_signo == SIGCHLD) continue;
        int status = on_signal((int)info.ssi_signo);
        if (status >= 0) return status;
      }
      reap();
    }
    if (p[1].revents) {
      int r = frame_reader_fill(&host_in, 0);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS)) {
        /* The host closed the channel: Node ends its commands and exits (agent.ts shutdown). */
        host_open = 0;
        if (node_pid == 0) return 0;
        clear(&to_node);
        if (node_w >= 0) close(node_w);
        node_w = -1;
        if (ending < 0) ending = 0, ending_deadline = 0;
      }
      struct frame f;
      for (int got; (got = frame_take(&host_in, &f)) != 0;)
        if (got > 0) on_host_frame(&f); /* else a framing error: hunting for the resync marker */
      frame_reader_trim(&host_in);
    }
    if (p[2].revents && drain(1, &to_host) < 0) {
      host_open = 0;
      clear(&to_host);
    }
    if (p[3].revents) {
      int r = frame_reader_fill(&node_in, node_r);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS)) {
        close(node_r); /* Node is ending; its exit comes as SIGCHLD */
        node_r = -1;
      }
      struct frame f;
      for (int got; (got = frame_take(&node_in, &f)) != 0;) {
        if (got > 0) {
          on_node_frame(&f);
          continue;
        }
        fputs("bothy-init: the guest agent wrote a malformed frame\n", stderr);
        if (node_pid > 0) kill(node_pid, SIGKILL);
        break;
      }
      frame_reader_trim(&node_in);
    }
    if (p[4].revents && drain(node_w, &to_node) < 0) {
      close(node_w); /* Node closed its stdin: it is ending */
      node_w = -1;
      clear(&to_node);
    }
  }
}
