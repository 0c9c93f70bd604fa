/*
 * bothy-init: PID 1 of a gVisor sandbox. It starts the guest agent and reaps every process that
 * ends up orphaned (a command's `sleep 60 &` outliving its shell is re-parented to PID 1, and
 * Node cannot wait for children it did not spawn, so without this they stay zombies until the
 * sandbox's pid limit runs out). It exits with the agent's status, which ends the sandbox.
 * Static, so it does not depend on the template's libc.
 *
 *   bothy-init PROGRAM [ARGS...]
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t agent;

static void forward(int sig) {
  if (agent > 0) kill(agent, sig);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bothy-init PROGRAM [ARGS...]\n");
    return 2;
  }
  agent = fork();
  if (agent < 0) {
    perror("bothy-init: fork");
    return 1;
  }
  if (agent == 0) {
    execv(argv[1], argv + 1);
    perror("bothy-init: exec");
    _exit(127);
  }
  signal(SIGTERM, forward);
  signal(SIGINT, forward);
  signal(SIGHUP, forward);
  for (;;) {
    int status;
    pid_t pid = wait(&status);
    if (pid == agent) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (pid < 0 && errno == ECHILD) return 1;
  }
}
