/* pc_guard.c — see pc_guard.h. Everything the handler does is async-signal-safe: write() of
 * bytes prepared beforehand, then _exit(). */
#include "pc_guard.h"

#if defined(_WIN32)

PC_API int pc_guard_install(void) { return PC_ERR_UNSUPPORTED; }
PC_API int pc_guard_set_message(const char *message, size_t length) {
    (void)length;
    return message ? PC_OK : PC_ERR_ARGUMENT;
}

#else

#include <signal.h>
#include <string.h>
#include <unistd.h>

/* Two buffers: set_message fills the one the handler is not reading, then flips `current`. */
static char messages[2][PC_GUARD_MESSAGE_MAX];
static size_t lengths[2];
static volatile sig_atomic_t current = 0;
static volatile sig_atomic_t installed = 0;

static const int guarded[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

static const char *signal_name(int sig) {
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "a fatal signal";
    }
}

static void write_all(const char *bytes, size_t length) {
    while (length > 0) {
        ssize_t n = write(STDERR_FILENO, bytes, length);
        if (n <= 0) return; /* nothing more can be said */
        bytes += n;
        length -= (size_t)n;
    }
}

static void on_fatal(int sig) {
    const char *name = signal_name(sig);
    int which = current;
    write_all("error: llama.cpp crashed (", 26);
    write_all(name, strlen(name));
    write_all(") ", 2);
    write_all(messages[which], lengths[which]);
    write_all("\n", 1);
    _exit(PC_GUARD_EXIT);
}

PC_API int pc_guard_install(void) {
    if (installed) return PC_OK;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_fatal;
    sigemptyset(&action.sa_mask);
    /* SA_ONSTACK: a stack overflow still reaches the handler where an alternate stack exists
     * (Python's faulthandler makes one). SA_RESETHAND: a fault inside the handler ends it. */
    action.sa_flags = SA_ONSTACK | SA_RESETHAND;
    for (size_t i = 0; i < sizeof guarded / sizeof guarded[0]; i++) {
        if (sigaction(guarded[i], &action, NULL) != 0) return PC_ERR_ARGUMENT;
    }
    installed = 1;
    return PC_OK;
}

PC_API int pc_guard_set_message(const char *message, size_t length) {
    if (!message) return PC_ERR_ARGUMENT;
    int next = !current;
    if (length > PC_GUARD_MESSAGE_MAX) length = PC_GUARD_MESSAGE_MAX;
    memcpy(messages[next], message, length);
    lengths[next] = length;
    current = next;
    return PC_OK;
}

#endif
