/*
 * runsc-waiter: runs on the HOST, not in a sandbox. It waits on a gVisor container for its whole
 * life and removes it when it ends, which a resident `runsc run` would do too: but that is a Go
 * program holding ~5 MB of memory per sandbox only to wait; this one holds ~0.2 MB.
 *
 *   runsc-waiter START... -- END...
 *
 * It becomes a child subreaper, runs START (`runsc ... run --detach --bundle B ID`, possibly
 * under `unshare`) with its own stdio, which runsc hands to the sandbox as the container's stdio,
 * and waits for it. START returns once the container runs, leaving the sandbox's processes (the
 * sentry, the gofer) orphaned: as subreaper, they become this process's children. It reaps them
 * until none is left (their own children, the ptrace stubs, come to it too when the sentry dies),
 * then runs END (`runsc ... delete --force ID`: the container's state and cgroup go, as `runsc
 * run` removes them when its container ends) and exits with the status of the first of START's
 * orphans that ended badly (a nonzero exit or a signal; 0 when none did), as `runsc run` ends
 * with its container's. So for its parent, the server, this process's end is the sandbox's, as
 * before.
 *
 * A START that fails ends it with START's status, after END (runsc may have left state behind).
 * Static and small: it must not cost the memory it saves.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* How a status reads as this process's own exit status, the shell's way. */
static int exit_status(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define MAX_ORPHANS 16

/* START's orphans: this process's children right after START ended (the sentry, the gofer). */
static int orphans(pid_t *out) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  int n = 0, pid;
  while (n < MAX_ORPHANS && fscanf(f, "%d", &pid) == 1) out[n++] = pid;
  fclose(f);
  return n;
}

static int is_orphan(pid_t pid, const pid_t *list, int n) {
  for (int i = 0; i < n; i++)
    if (list[i] == pid) return 1;
  return 0;
}

/* Runs argv as a child with this process's stdio; returns its wait status, or -1. */
static int run_and_wait(char **argv) {
  pid_t pid = fork();
  if (pid < 0) return perror("runsc-waiter: fork"), -1;
  if (pid == 0) {
    /* runsc and the sandbox it leaves keep the default dispositions; ignoring is this process's own. */
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    execvp(argv[0], argv);
    fprintf(stderr, "runsc-waiter: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return perror("runsc-waiter: waitpid"), -1;
  return status;
}

int main(int argc, char **argv) {
  int sep = 1;
  while (sep < argc && strcmp(argv[sep], "--") != 0) sep++;
  if (sep == 1 || sep >= argc - 1) {
    fputs("usage: runsc-waiter START... -- END...\n", stderr);
    return 2;
  }
  argv[sep] = NULL;
  char **start = argv + 1, **end = argv + sep + 1;
  /* The server's signals meant for it (a terminal's Ctrl-C) must not end the wait. */
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) return perror("runsc-waiter: PR_SET_CHILD_SUBREAPER"), 1;
  int started = run_and_wait(start);
  /* The agent's channel belongs to the sandbox now: hold no end of it. stderr stays (runsc's log). */
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    dup2(null, 0);
    dup2(null, 1);
    close(null);
  }
  int result = started < 0 ? 1 : exit_status(started);
  pid_t left[MAX_ORPHANS];
  int nleft = orphans(left);
  for (;;) {
    int status;
    pid_t pid = wait(&status);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break; /* ECHILD: the sandbox's processes are all gone */
    }
    /* A stub SIGKILLed because its sentry ended says nothing about how the sandbox ended. */
    if (result == 0 && exit_status(status) != 0 && (nleft == 0 || is_orphan(pid, left, nleft)))
      result = exit_status(status);
  }
  int ended = run_and_wait(end);
  /* A START that failed may have left nothing to delete: END's failure then says nothing new. */
  if (result == 0 && ended != 0) result = ended < 0 ? 1 : exit_status(ended);
  return result;
}
