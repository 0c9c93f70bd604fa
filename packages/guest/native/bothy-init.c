/*
 * bothy-init: PID 1 of a gVisor sandbox. It starts the guest agent and reaps every process that
 * ends up orphaned (a command's `sleep 60 &` outliving its shell is re-parented to PID 1, and
 * Node cannot wait for children it did not spawn, so without this they stay zombies until the
 * sandbox's pid limit runs out). It exits with the agent's status, which ends the sandbox.
 * Static, so it does not depend on the template's libc.
 *
 * First it mounts gVisor's pids cgroup controller (cgroup v1, on a tmpfs at /sys/fs/cgroup) and
 * makes the `commands` cgroup the agent puts every command in: its pids.max is the sandbox's
 * process limit (set from the host's `limits`), so a fork bomb gets EAGAIN. The
 * agent itself stays outside it. gVisor's controller charges a cgroup's own tasks only, not its
 * children's, so the commands share this one cgroup rather than one each. Mounting needs
 * CAP_SYS_ADMIN, which the container's process has only for this: bothy-init drops it from every
 * set (bounding set included) before it starts the agent, so no command ever holds it, and
 * refuses to start the agent if it cannot.
 *
 * The host's channel (fds 0 and 1) is served by bothy-init's native front (front.c): hello and
 * `limits` are answered here, and the Node agent starts on the first frame that needs it, so a
 * sandbox that has booted has no Node yet. A template with boot hooks starts Node at boot, since
 * the hooks must have run before the host hears hello. With --no-front the agent holds the
 * channel itself from the boot, as before the front. The agent comes with its command spawner
 * (agent-start.c).
 *
 *   bothy-init [--no-front] [--fallback PROGRAM2 [ARGS2...] --] PROGRAM [ARGS...]
 *
 * With --fallback, an agent that exits 127 (the dynamic loader's status when PROGRAM's libraries
 * do not fit the template, or an exec failure) is started once more as PROGRAM2 ARGS2: the host's
 * Node runs the agent where it can (from its startup snapshot, which only that Node can read),
 * the template's own Node, with the agent's script, everywhere else.
 */
#include <errno.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-start.h"
#include "front.h"

static pid_t agent;
/* The spawner helper started with the agent, 0 when there is none. */
static pid_t helper;

#define CGROUP_ROOT "/sys/fs/cgroup"
#define PIDS_ROOT CGROUP_ROOT "/pids"
#define COMMANDS_CGROUP PIDS_ROOT "/commands"
/* Until the host says otherwise; the same default as the server's. */
#define DEFAULT_MAX_PROCESSES "1024"

static int write_file(const char *path, const char *value) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  int ok = fputs(value, f) >= 0;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* Returns 0 with the commands cgroup ready, else -1 (and says why on stderr). */
static int commands_cgroup(void) {
  if (mount("none", CGROUP_ROOT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755") < 0) return perror("bothy-init: mount " CGROUP_ROOT), -1;
  if (mkdir(PIDS_ROOT, 0755) < 0) return perror("bothy-init: mkdir " PIDS_ROOT), -1;
  if (mount("none", PIDS_ROOT, "cgroup", MS_NOSUID | MS_NODEV | MS_NOEXEC, "pids") < 0) return perror("bothy-init: mount pids cgroup"), -1;
  if (mkdir(COMMANDS_CGROUP, 0755) < 0) return perror("bothy-init: mkdir " COMMANDS_CGROUP), -1;
  if (write_file(COMMANDS_CGROUP "/pids.max", DEFAULT_MAX_PROCESSES) < 0) return perror("bothy-init: pids.max"), -1;
  return 0;
}

static void forward(int sig) {
  if (agent > 0) kill(agent, sig);
}

/* Gives CAP_SYS_ADMIN up for good: no process started from here on can have it. */
static int drop_sys_admin(void) {
  if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) < 0) return perror("bothy-init: PR_CAPBSET_DROP"), -1;
  struct __user_cap_header_struct header = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &header, data) < 0) return perror("bothy-init: capget"), -1;
  for (int i = 0; i < 2; i++) {
    unsigned bit = CAP_SYS_ADMIN / 32 == i ? 1u << (CAP_SYS_ADMIN % 32) : 0;
    data[i].effective &= ~bit;
    data[i].permitted &= ~bit;
    data[i].inheritable &= ~bit;
  }
  if (syscall(SYS_capset, &header, data) < 0) return perror("bothy-init: capset"), -1;
  return 0;
}

/* The agent holds the channel from the boot (--no-front): PID 1 only reaps and forwards signals. */
static int run_agent(char **argv, char **fallback) {
  agent = start_agent(argv, 0, 1, 0, &helper);
  if (agent < 0) return 1;
  signal(SIGTERM, forward);
  signal(SIGINT, forward);
  signal(SIGHUP, forward);
  for (;;) {
    int status;
    pid_t pid = wait(&status);
    if (pid == agent && fallback && WIFEXITED(status) && WEXITSTATUS(status) == NOT_RUNNABLE) {
      fprintf(stderr, "bothy-init: %s could not run; starting the agent with %s\n", argv[0], fallback[0]);
      if (helper > 0) kill(helper, SIGKILL); /* waiting for an agent that never ran */
      agent = start_agent(fallback, 0, 1, 0, &helper);
      fallback = NULL;
      if (agent < 0) return 1;
      continue;
    }
    if (pid == agent) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (pid < 0 && errno == ECHILD) return 1;
  }
}

int main(int argc, char **argv) {
  static const char usage[] = "usage: bothy-init [--no-front] [--fallback PROGRAM2 [ARGS2...] --] PROGRAM [ARGS...]\n";
  char **fallback = NULL;
  int first = 1, front = 1;
  if (argc > first && strcmp(argv[first], "--no-front") == 0) front = 0, first++;
  if (argc > first && strcmp(argv[first], "--fallback") == 0) {
    int end = first + 1;
    while (end < argc && strcmp(argv[end], "--") != 0) end++;
    if (end == first + 1 || end == argc) return fputs(usage, stderr), 2; /* no PROGRAM2, or no `--` */
    fallback = argv + first + 1;
    argv[end] = NULL; /* ends the fallback's argv */
    first = end + 1;
  }
  if (argc <= first) return fputs(usage, stderr), 2;
  /* Without it commands have no process limit; `limits` is then refused, so the sandbox fails to
     start rather than run unlimited. */
  int cgroup = commands_cgroup() == 0;
  if (cgroup) setenv("BOTHY_COMMANDS_CGROUP", COMMANDS_CGROUP, 1);
  if (drop_sys_admin() < 0) return 1;
  if (!front) return run_agent(argv + first, fallback);
  struct front_options opts = {
    .agent = argv + first,
    .fallback = fallback,
    .commands_cgroup = cgroup ? COMMANDS_CGROUP : NULL,
    .start_now = front_has_boot_hooks(),
  };
  return front_run(&opts);
}
