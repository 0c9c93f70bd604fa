/* bothy-init's native front (front.c): the host's channel answered in C, Node started on demand. */
#ifndef BOTHY_FRONT_H
#define BOTHY_FRONT_H

struct front_options {
  char **agent;              /* the Node agent's argv */
  char **fallback;           /* its argv where the first cannot run (exit 127), or NULL */
  const char *commands_cgroup; /* the commands' pids cgroup, NULL without one */
  int start_now;             /* start Node at boot and say hello only after its (boot hooks) */
};

/* Serves the host's channel on fds 0 and 1 until the sandbox ends; returns bothy-init's status. */
int front_run(const struct front_options *opts);

/* Whether the template has boot hooks (executables in /etc/bothy/boot.d, as boot-hooks.ts finds them). */
int front_has_boot_hooks(void);

#endif
