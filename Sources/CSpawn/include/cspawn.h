#ifndef CSPAWN_H
#define CSPAWN_H
#include <sys/types.h>

// Starts a child process for LogTesting's ChildProcess: posix_spawn with the
// child's stdin, stdout and stderr set to the given descriptors and every
// other descriptor closed in the child, so it inherits nothing of this
// process (its stores, its other children's pipes).
//
// Foundation's Process does this too, but on Linux it first lists
// /proc/self/fd through a 256-byte copy of each directory entry, which reads
// past glibc's buffer when the process has about 1,300 descriptors open and
// crashes (swift-corelibs-foundation pull request 5472, in Swift 6.3.1).

/// Spawns `path` with `argv` and `envp` (both ending in NULL; a NULL `envp`
/// passes this process's environment); with `new_group` set, in a process
/// group of its own (its pid), so that the group can be signalled as one.
/// - Returns: 0 and the child's pid in `pid`, or an errno value.
int cspawn(const char *path, char *const argv[], char *const envp[], int stdin_fd, int stdout_fd, int stderr_fd,
           int new_group, pid_t *pid);

/// A pipe whose two ends are closed on exec (the child gets its copies
/// through cspawn's dup2, which clears that flag).
/// - Returns: 0, or an errno value.
int cspawn_pipe(int fds[2]);

/// Waits for the child `pid` to end without reaping it (retrying on EINTR):
/// until `cspawn_wait` reaps it, its pid stays its own, so a signal sent to
/// it cannot reach another process that reused the number.
/// - Returns: 0, or an errno value.
int cspawn_wait_ended(pid_t pid);

/// Waits for the child `pid` to end and reaps it (retrying on EINTR).
/// - Returns: 0 with either `exit_status` set (and `signal` 0) or `signal`
///   set (the signal that ended it), or an errno value.
int cspawn_wait(pid_t pid, int *exit_status, int *signal);

#endif
