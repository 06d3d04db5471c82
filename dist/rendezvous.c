/* ct's own rendezvous where no ct launcher started the ranks (env://, a
 * Slurm step without PMI): the job's secret, and the check-in through the
 * store that refuses a rank claimed twice and counts the ranks on each
 * machine.
 *
 * The secret. One the process was given (ct_secret_set, CT_JOB_SECRET,
 * CT_SECRET_FILE) is used as it is. Without one, a job whose ranks are all
 * on this machine gets one from rank 0: it writes a random secret into a
 * file of a directory only this user can enter ($XDG_RUNTIME_DIR/ct, else
 * /tmp/ct-UID), named by the store's port and the restart, and the others
 * read it there. Across machines there is no such place, and a job without
 * a secret is refused (docs/multinode.md). */
#include "dist_impl.h"

#include "base_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define POLL_S 0.02 /* how often a rank looks for rank 0's secret file */

/* ------------------------------------------------------------- the secret */

/* The private directory of secret files, made if absent, as an fd (the
 * files are opened relative to it); path names it in messages. It must be
 * this user's and closed to everyone else: another user could otherwise
 * have made it first and read the secrets. */
static int secret_dir(int *fd, char path[256]) {
    const char *run = getenv("XDG_RUNTIME_DIR");
    if (run && *run)
        snprintf(path, 256, "%s/ct", run);
    else
        snprintf(path, 256, "/tmp/ct-%u", (unsigned)geteuid());
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return ct__err_set(CT_EIO, "the job's secret: cannot make %s: %s", path, strerror(errno));
    *fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*fd < 0)
        return ct__err_set(CT_EIO, "the job's secret: cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(*fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
        close(*fd);
        *fd = -1;
        return ct__err_set(CT_EINVAL,
                           "the job's secret: %s is not a directory of this user's that only it "
                           "can enter; remove it, or give the job a secret (CT_JOB_SECRET, "
                           "CT_SECRET_FILE)",
                           path);
    }
    return 0;
}

static void secret_name(const ct_world *w, char name[64]) {
    snprintf(name, 64, "job-%d-%d.secret", w->master_port, w->restart_count);
}

/* Rank 0: a new random secret, written whole under a name of its own and
 * renamed into place, so that a reader never sees half of one (and a stale
 * file of a crashed job is replaced in one step). */
static int write_secret(int dir, const char *path, const char *name, char secret[]) {
    char tmp[96];
    snprintf(tmp, sizeof tmp, "%s.%ld", name, (long)getpid());
    int rc = ct_secret_generate(secret);
    if (rc)
        return rc;
    unlinkat(dir, tmp, 0);
    int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return ct__err_set(CT_EIO, "the job's secret: cannot create %s/%s: %s", path, tmp,
                           strerror(errno));
    size_t len = strlen(secret);
    bool ok = write(fd, secret, len) == (ssize_t)len;
    ok = close(fd) == 0 && ok;
    if (!ok || renameat(dir, tmp, dir, name) != 0) {
        rc = ct__err_set(CT_EIO, "the job's secret: cannot write %s/%s: %s", path, name,
                         strerror(errno));
        unlinkat(dir, tmp, 0);
    }
    return rc;
}

/* The others: rank 0's file once it is there, within timeout_s. */
static int read_secret(int dir, const char *path, const char *name, double timeout_s,
                       char secret[]) {
    double start = ct__now();
    struct stat st;
    while (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno != ENOENT)
            return ct__err_set(CT_EIO, "the job's secret: %s/%s: %s", path, name, strerror(errno));
        if (ct__now() - start > timeout_s)
            return ct__err_set(CT_ETIMEDOUT,
                               "the job's secret: waited %.1f s for rank 0 to write %s/%s; is "
                               "rank 0 running on this machine? Ranks on several machines need "
                               "a secret of their own (CT_JOB_SECRET or CT_SECRET_FILE)",
                               timeout_s, path, name);
        nanosleep(&(struct timespec){0, (long)(POLL_S * 1e9)}, NULL);
    }
    return ct__auth_read_secret_at(dir, name, secret);
}

/* Whether every rank is on this machine, as far as the world tells: the
 * local size, else a store on a loopback address, which no other machine
 * can reach. */
static bool one_machine(const ct_world *w) {
    if (w->local_size > 0)
        return w->local_size == w->size;
    return strncmp(w->master_addr, "127.", 4) == 0 || !strcmp(w->master_addr, "localhost");
}

/* Rank 0 (make) writes a new secret into the job's file, the others read
 * it there within timeout_s; either way it becomes this process's. */
static int file_secret(const ct_world *w, bool make, double timeout_s) {
    int dir;
    char path[256], name[64], secret[CT_SECRET_MAX + 1];
    int rc = secret_dir(&dir, path);
    if (rc)
        return rc;
    secret_name(w, name);
    rc = make ? write_secret(dir, path, name, secret)
              : read_secret(dir, path, name, timeout_s, secret);
    close(dir);
    if (!rc)
        rc = ct_secret_set(secret);
    memset(secret, 0, sizeof secret);
    return rc;
}

int ct__dist_rdzv_secret(const ct_world *w, double timeout_s, bool *file) {
    *file = false;
    if (ct__auth_secret_given())
        return 0;
    if (!one_machine(w))
        return ct__err_set(CT_EAUTH,
                           "the job's secret: the %d ranks (%s) span machines, and the store at "
                           "%s:%d serves only processes that prove the job's secret; give every "
                           "rank the same one in CT_JOB_SECRET or CT_SECRET_FILE (a file only "
                           "this user can read; docs/multinode.md)",
                           w->size, ct_world_source_name(w->source), w->master_addr,
                           w->master_port);
    int rc = file_secret(w, w->rank == 0, timeout_s);
    *file = rc == 0;
    return rc;
}

int ct__dist_rdzv_reread_secret(const ct_world *w) { return file_secret(w, false, 0); }

void ct__dist_rdzv_secret_remove(const ct_world *w) {
    int dir;
    char path[256], name[64];
    if (secret_dir(&dir, path) != 0) {
        ct_errclear();
        return;
    }
    secret_name(w, name);
    unlinkat(dir, name, 0);
    close(dir);
}

/* -------------------------------------------------------------- check-in */

/* This machine: its host name and boot id. Network namespaces of one
 * kernel, which the test cluster makes into hosts, share the boot id and
 * differ by name; real machines differ by boot id whatever their names. */
static void machine_id(char out[192]) {
    char host[65] = "?", boot[40] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "?");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    snprintf(out, 192, "%s/%s", host, boot);
}

uint64_t ct__dist_rdzv_machine_key(void) {
    char machine[192];
    machine_id(machine);
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = machine; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

/* Tells every rank that waits for key that the world cannot form. */
static int fail_all(ct_store *s, const char *key, int code) {
    char text[600];
    snprintf(text, sizeof text, "error: %s", ct_errmsg());
    ct_store_set(s, key, text, strlen(text), -1);
    return ct__err_set(code, "%s", text + 7);
}

int ct__dist_rdzv_check_in(ct_store *s, ct_world *w, const char *prefix) {
    char machine[192], me[256], key[512], all[256];
    machine_id(machine);
    snprintf(me, sizeof me, "%s pid %ld", machine, (long)getpid());
    snprintf(all, sizeof all, "%sall", prefix);
    snprintf(key, sizeof key, "%srank/%d", prefix, w->rank);
    void *held = NULL;
    size_t len = 0;
    int rc = ct_store_compare_set(s, key, NULL, 0, me, strlen(me), &held, &len, -1);
    if (!rc && (len != strlen(me) || memcmp(held, me, len) != 0)) {
        ct__err_set(CT_EINVAL,
                    "two processes claim rank %d of %d (%s): one on %s and this one on %s; "
                    "every process of the job needs a rank of its own",
                    w->rank, w->size, ct_world_source_name(w->source), (char *)held, me);
        rc = fail_all(s, all, CT_EINVAL);
    }
    free(held);
    int64_t here = 0, arrived = 0, local = 0;
    snprintf(key, sizeof key, "%shost/%s", prefix, machine);
    if (!rc)
        rc = ct_store_add(s, key, 1, &here, -1);
    char arrivals[512];
    snprintf(arrivals, sizeof arrivals, "%sarrived", prefix);
    if (!rc)
        rc = ct_store_add(s, arrivals, 1, &arrived, -1);
    if (!rc && arrived == w->size)
        rc = ct_store_set(s, all, "ok", 2, -1);
    void *verdict = NULL;
    if (!rc && (rc = ct_store_get(s, all, &verdict, &len, -1)) == CT_ETIMEDOUT) {
        int64_t now = 0;
        ct_store_add(s, arrivals, 0, &now, -1);
        rc = ct__err_set(CT_ETIMEDOUT,
                         "%lld of the %d ranks (%s) checked in at the store %s:%d; the others "
                         "did not come",
                         (long long)now, w->size, ct_world_source_name(w->source), w->master_addr,
                         w->master_port);
    }
    if (!rc && strcmp(verdict, "ok") != 0)
        rc = ct__err_set(CT_EPEER, "another rank could not join: %s", (char *)verdict + 7);
    free(verdict);
    if (!rc)
        rc = ct_store_add(s, key, 0, &local, -1);
    if (!rc && w->local_size > 0 && local != w->local_size)
        rc = ct__err_set(CT_EINVAL,
                         "the environment says %d ranks run on this machine (%s), but %lld "
                         "checked in from it (%s)",
                         w->local_size, ct_world_source_name(w->source), (long long)local, machine);
    if (!rc && w->local_size == 0) {
        w->local_size = (int)local;
        if (w->local_rank < 0)
            w->local_rank = (int)here - 1;
    }
    return rc;
}
