/*
 * Starts the guest agent, and the command spawner (bothy-helper spawner, see spawner.c) beside it
 * when the helper is installed: started by the agent, with Node's child_process.spawn, the helper
 * cost the agent's start ~40 ms of forking a large process under gVisor's ptrace, on its only
 * thread. bothy-init listens on a control socket first, then starts the agent, telling it where
 * with BOTHY_SPAWNER ("CONTROL STREAMS", two socket paths), and the helper, which takes the first
 * connection, the agent's, as its request channel. No descriptor is handed down: the agent's
 * commands inherit nothing of it.
 */
#include "agent-start.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define HELPER "/opt/bothy/bothy-helper"
#define SPAWNER_DIR "/run/bothy"
#define SPAWNER_CONTROL SPAWNER_DIR "/spawner-control.sock"
#define SPAWNER_STREAMS SPAWNER_DIR "/spawner.sock"

/* The spawner's control socket, listening; -1 without a helper (the agent then spawns its own). */
static int spawner_control(void) {
  if (access(HELPER, X_OK) < 0) return -1;
  if (mkdir(SPAWNER_DIR, 0700) < 0 && errno != EEXIST) return perror("bothy-init: mkdir " SPAWNER_DIR), -1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return perror("bothy-init: socket"), -1;
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  strcpy(addr.sun_path, SPAWNER_CONTROL);
  unlink(SPAWNER_CONTROL); /* an earlier agent's */
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 4) < 0) {
    perror("bothy-init: spawner control socket");
    close(fd);
    return -1;
  }
  return fd;
}

/* bothy-init blocks the signals it reads from a signalfd; a child starts with none blocked. */
static void unblock_signals(void) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The helper's spawner, its control socket as fd 0 and 1. */
static pid_t start_helper(int control) {
  pid_t pid = fork();
  if (pid < 0) return perror("bothy-init: fork helper"), 0;
  if (pid == 0) {
    unblock_signals();
    if (dup2(control, 0) < 0 || dup2(control, 1) < 0) _exit(1); /* fd 1 is the host's channel */
    char *args[] = { "bothy-helper", "spawner", SPAWNER_STREAMS, "--control", NULL };
    execv(HELPER, args);
    perror("bothy-init: exec " HELPER);
    _exit(NOT_RUNNABLE);
  }
  return pid;
}

pid_t start_agent(char **argv, int in, int out, int front, pid_t *helper) {
  *helper = 0;
  int control = spawner_control();
  pid_t pid = fork();
  if (pid < 0) {
    perror("bothy-init: fork");
    if (control >= 0) close(control);
    return -1;
  }
  if (pid == 0) {
    unblock_signals();
    if ((in != 0 && dup2(in, 0) < 0) || (out != 1 && dup2(out, 1) < 0)) _exit(NOT_RUNNABLE);
    /* Only in the agent's environment, which the agent empties of its own variables. */
    if (control >= 0) setenv("BOTHY_SPAWNER", SPAWNER_CONTROL " " SPAWNER_STREAMS, 1);
    if (front) setenv("BOTHY_FRONT", "1", 1);
    execv(argv[0], argv);
    perror("bothy-init: exec");
    _exit(NOT_RUNNABLE);
  }
  if (control >= 0) {
    *helper = start_helper(control);
    close(control); /* the helper's now; without a helper the agent's connect is refused */
  }
  return pid;
}
