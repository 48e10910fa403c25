/* A member that re-forks: after SIGTERM it forks a successor and exits, every argv[1] microseconds, for
   ever (the successor inherits the flag and goes on). Built by tests/functional/test_reap_round3.py. */
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t go = 0;

static void on_term(int sig) { (void)sig; go = 1; }

int main(int argc, char **argv) {
    long us = argc > 1 ? atol(argv[1]) : 300;
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, 0);
    struct timespec idle = {0, 1000000}, step = {0, us * 1000};
    while (!go)
        nanosleep(&idle, 0);
    for (;;) {
        nanosleep(&step, 0);
        pid_t p = fork();
        if (p > 0)
            _exit(0);
    }
}
