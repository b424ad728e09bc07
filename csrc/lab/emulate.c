/* Asymmetry emulator: the spin/sleep loop of one helper. See emulate.h. */
#define _GNU_SOURCE
#include "emulate.h"
#include "pool/spin.h" /* now_ns, cpu_relax */

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define NSEC_PER_SEC 1000000000LL

static void sleep_until(int64_t t_ns)
{
    struct timespec ts = {.tv_sec = t_ns / NSEC_PER_SEC, .tv_nsec = t_ns % NSEC_PER_SEC};
    /* Absolute deadline: a signal or an early wake-up just retries to the same instant, and
     * errors never accumulate from period to period. */
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static void report(int fd, const char *line)
{
    if (fd < 0)
        return;
    size_t len = strlen(line), off = 0;
    while (off < len) {
        ssize_t n = write(fd, line + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    close(fd);
}

static int fail(int fd, const char *step, int err)
{
    char line[96];
    snprintf(line, sizeof line, "error %s %d\n", step, err);
    report(fd, line);
    return -err;
}

/* Lowest nice value this thread may take (RLIMIT_NICE, CAP_SYS_NICE), tried from -20 up.
 * On Linux, PRIO_PROCESS with who = 0 changes the calling thread only. */
static int lower_nice(void)
{
    errno = 0;
    int current = getpriority(PRIO_PROCESS, 0);
    if (errno != 0)
        current = 0;
    for (int n = -20; n < current; n++) {
        if (setpriority(PRIO_PROCESS, 0, n) == 0)
            return n;
    }
    return current;
}

/* With CONFIG_SCHED_AUTOGROUP each session shares the cpu equally with every other session
 * whatever the nice values inside it, so a nice value alone would not outweigh a workload in
 * another session. The helper runs in a session of its own: give that group the same nice.
 * Returns 1 if set (or autogroups are absent), 0 if refused. */
static int set_autogroup_nice(int nice)
{
    FILE *f = fopen("/proc/self/autogroup", "w");
    if (f == NULL)
        return errno == ENOENT;
    int ok = fprintf(f, "%d", nice) > 0;
    ok = (fclose(f) == 0) && ok;
    return ok;
}

int asymo_occupy_core(const asymo_occupy_params *p, asymo_occupy_stats *stats)
{
    asymo_occupy_stats local;
    if (stats == NULL)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    int fd = p ? p->ready_fd : -1;

    if (p == NULL || p->cpu < 0 || p->cpu >= CPU_SETSIZE || !(p->busy_fraction >= 0.0) ||
        !(p->busy_fraction < 1.0) || p->period_ns < 10000 || p->period_ns > NSEC_PER_SEC ||
        !(p->time_limit_s > 0.0) || !(p->time_limit_s < 1e9) ||
        (p->mode != ASYMO_OCCUPY_FIFO && p->mode != ASYMO_OCCUPY_APPROXIMATE))
        return fail(fd, "params", EINVAL);

    if (p->parent_pid > 0) {
        /* The death signal is armed only from here on: if the parent died between our
         * fork and this call, getppid() already names our new reaper. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
            return fail(fd, "prctl", errno);
        if (getppid() != p->parent_pid)
            return fail(fd, "parent", ESRCH);
    }

    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(p->cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        return fail(fd, "sched_setaffinity", errno);

    /* Timer slack would delay every wake-up (50 us by default for normal threads). */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

    char ok[96];
    if (p->mode == ASYMO_OCCUPY_FIFO) {
        struct sched_param sp = {.sched_priority = 1};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
            return fail(fd, "sched_setscheduler", errno);
        snprintf(ok, sizeof ok, "ok fifo priority=1\n");
    } else {
        struct sched_param sp = {.sched_priority = 0};
        sched_setscheduler(0, SCHED_OTHER, &sp);
        stats->nice = lower_nice();
        /* Only a session leader (a helper started in a session of its own) owns its group. */
        int group = (stats->nice < 0 && getsid(0) == getpid()) ? set_autogroup_nice(stats->nice)
                                                                : 1;
        snprintf(ok, sizeof ok, "ok approximate nice=%d%s\n", stats->nice,
                 group ? "" : " (session group nice refused)");
    }
    report(fd, ok);

    const int64_t period = p->period_ns;
    const int64_t busy = (int64_t)llround(p->busy_fraction * (double)period);
    const int64_t t0 = now_ns();
    const int64_t end = t0 + (int64_t)(p->time_limit_s * 1e9);
    int64_t start = t0, t = t0;
    stats->stop_reason = ASYMO_OCCUPY_TIME_LIMIT;

    while (start < end) {
        /* The busy phase ends on the grid, at start + busy, however late the wake-up was:
         * the time from the timer's deadline to this thread running (interrupt, switching
         * away from the workload, a VM exit) is taken from the other threads too, so it is
         * part of the share this helper takes, not extra. */
        int64_t busy_end = start + busy < end ? start + busy : end;
        int64_t spin_from = t;
        while ((t = now_ns()) < busy_end)
            cpu_relax();
        if (busy_end > spin_from) {
            stats->busy_ns += t - spin_from;
            stats->periods++;
        }
        if (p->parent_pid > 0 && getppid() != p->parent_pid) {
            stats->stop_reason = ASYMO_OCCUPY_PARENT_GONE;
            break;
        }
        int64_t next = start + period;
        if (t >= next) {
            /* Ran late (throttled or preempted): rejoin the grid instead of catching up,
             * which would occupy the core for longer than asked. */
            int64_t behind = (t - start) / period;
            stats->skipped += behind - 1;
            next = start + (behind + 1) * period;
        }
        if (next >= end)
            break;
        sleep_until(next);
        t = now_ns();
        stats->late_ns += t - next;
        start = next;
    }
    stats->elapsed_ns = now_ns() - t0;
    return 0;
}
