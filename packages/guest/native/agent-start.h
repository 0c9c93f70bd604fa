/* Starting the guest agent and its command spawner (agent-start.c), for bothy-init and its front. */
#ifndef BOTHY_AGENT_START_H
#define BOTHY_AGENT_START_H

#include <sys/types.h>

/* The agent's status when it could not run at all: exec failed, or the dynamic loader refused. */
#define NOT_RUNNABLE 127

/*
 * Starts the agent, argv[0] with argv, its stdin and stdout on `in` and `out` (which it dups: the
 * caller keeps and closes its own), and the spawner helper beside it when the helper is installed
 * (*helper its pid, 0 without one). `front` says the agent runs behind bothy-init's native front
 * (BOTHY_FRONT=1 in its environment). Returns the agent's pid, or -1.
 */
pid_t start_agent(char **argv, int in, int out, int front, pid_t *helper);

#endif
