/* pc_guard.h — one clear line before the process dies of a fatal signal raised in native code.
 *
 * A fault inside llama.cpp (e.g. its AMX matmul on some CPUs: ggml-org/llama.cpp#20824) kills
 * the process with no message. Once installed, the guard catches SIGSEGV, SIGBUS, SIGILL, SIGFPE
 * and SIGABRT, writes "error: llama.cpp crashed (SIGSEGV) " followed by the caller's message and
 * a newline to stderr, and ends the process with exit code PC_GUARD_EXIT. It cannot recover:
 * after such a signal the process state is unknown, so it only speaks and exits.
 *
 * Python's faulthandler, enabled after the guard, runs first (its traceback), then hands the
 * signal on to the guard, whose line is then the last one printed.
 *
 * Conventions as in pc_state.h: 0 on success, a negative pc_status otherwise.
 */
#ifndef PC_GUARD_H
#define PC_GUARD_H

#include <stddef.h>

#include "pc_state.h"

#define PC_GUARD_EXIT 2         /* the CLI's exit code for every failure */
#define PC_GUARD_MESSAGE_MAX 1024 /* bytes of the caller's message kept; longer ones are cut */

/* Installs the handlers (idempotent: a second call changes nothing). Returns PC_ERR_UNSUPPORTED
 * where signals cannot be caught this way (Windows), PC_ERR_ARGUMENT if sigaction fails. */
PC_API int pc_guard_install(void);

/* Sets what the guard says after "error: llama.cpp crashed (SIGNAME) ": at most
 * PC_GUARD_MESSAGE_MAX bytes of `message` (UTF-8, no newline needed) are copied, so the caller's
 * buffer may be freed at once. Safe to call while another thread could crash: the handler reads
 * either the old message or the new one, whole. Returns PC_ERR_ARGUMENT when message is NULL. */
PC_API int pc_guard_set_message(const char *message, size_t length);

#endif
