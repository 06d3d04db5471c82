/* The job's secret and the check every store and RPC connection passes.
 *
 * One secret per process, found once: set by the program, or CT_JOB_SECRET
 * (ctlaunch puts it there), or the file CT_SECRET_FILE names, or, under an
 * MPI launcher, rank 0's broadcast by ct_dist_init; a process that has none
 * of these makes a random one, which its own servers and clients (and its
 * forked children) share and nobody else knows.
 *
 * Listeners use zmq's PLAIN mechanism with a ZAP handler of their own: the
 * handler runs on the listener's thread, in its poll loop, and accepts a
 * connection only when the password is the secret (compared in constant
 * time). zmq then serves nothing of that connection before the handshake
 * succeeds, so the cost is at connect time, never per message. PLAIN sends
 * the secret in clear once per connection: docs/security.md says what that
 * protects against and what it does not. */
#include "dist_impl.h"

#include "base_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN   "ct"
/* Refusals are logged at most once a second per listener, with a count of
 * those left out, so that a flood of bad connections cannot flood stderr. */
#define REFUSAL_LOG_S 1.0

static pthread_mutex_t secret_mu = PTHREAD_MUTEX_INITIALIZER;
static char secret[CT_SECRET_MAX + 1];
static size_t secret_len;
static const char *secret_origin; /* NULL until the secret is known */
#define RANDOM_ORIGIN "this process's random secret"

static int check_secret(const char *s, size_t len, const char *what) {
    if (len < CT_SECRET_MIN || len > CT_SECRET_MAX)
        return ct__err_set(CT_EINVAL, "secret: %s is %zu bytes; expected %d to %d", what, len,
                           CT_SECRET_MIN, CT_SECRET_MAX);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return ct__err_set(CT_EINVAL,
                               "secret: %s has a byte 0x%02x at offset %zu; expected printable "
                               "ASCII without spaces",
                               what, (unsigned char)s[i], i);
    return 0;
}

/* Stores s under secret_mu. */
static int store_secret(const char *s, size_t len, const char *origin) {
    int rc = check_secret(s, len, origin);
    if (rc)
        return rc;
    memcpy(secret, s, len);
    secret[len] = 0;
    secret_len = len;
    secret_origin = origin;
    return 0;
}

int ct_secret_set(const char *s) {
    if (!s)
        return ct__err_set(CT_EINVAL, "ct_secret_set: the secret is NULL");
    pthread_mutex_lock(&secret_mu);
    int rc = store_secret(s, strlen(s), "the secret set by the program");
    pthread_mutex_unlock(&secret_mu);
    return rc;
}

int ct_secret_generate(char out[CT_SECRET_HEX_LEN + 1]) {
    unsigned char raw[CT_SECRET_HEX_LEN / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno != EINTR)
            return ct__err_set(CT_EFOREIGN, "secret: getrandom failed: %s", strerror(errno));
        got += n > 0 ? (size_t)n : 0;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

int ct__auth_read_secret_at(int dir, const char *path, char out[CT_SECRET_MAX + 1]) {
    if (!path || !*path)
        return ct__err_set(CT_EINVAL, "secret file: the path is %s", path ? "empty" : "NULL");
    /* O_NONBLOCK: a FIFO in its place must not hang the reader. */
    int fd = openat(dir, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return ct__err_set(errno == ELOOP ? CT_EINVAL : CT_EIO, "secret file %s: %s", path,
                           errno == ELOOP ? "is a symbolic link; name the file itself"
                                          : strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = ct__err_set(CT_EIO, "secret file %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = ct__err_set(CT_EINVAL, "secret file %s: not a regular file", path);
    else if (st.st_uid != geteuid())
        rc = ct__err_set(CT_EINVAL, "secret file %s: owned by uid %u, not by this user (%u)", path,
                         (unsigned)st.st_uid, (unsigned)geteuid());
    else if (st.st_mode & 077)
        rc = ct__err_set(CT_EINVAL,
                         "secret file %s: mode %03o lets others read or change it; chmod 600 it",
                         path, (unsigned)(st.st_mode & 0777));
    else if (st.st_size > CT_SECRET_MAX + 2)
        rc = ct__err_set(CT_EINVAL, "secret file %s: %lld bytes; a secret is at most %d", path,
                         (long long)st.st_size, CT_SECRET_MAX);
    size_t len = 0;
    char buf[CT_SECRET_MAX + 3];
    while (!rc) {
        ssize_t n = read(fd, buf + len, sizeof buf - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = ct__err_set(CT_EIO, "secret file %s: %s", path, strerror(errno));
        else if (n == 0 || (len += (size_t)n) == sizeof buf)
            break;
    }
    close(fd);
    /* Editors end the line; the newline is not part of the secret. */
    while (!rc && len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
        len--;
    if (!rc && !(rc = check_secret(buf, len, "the secret file's content"))) {
        memcpy(out, buf, len);
        out[len] = 0;
    }
    return rc;
}

int ct_secret_read_file(const char *path, char out[CT_SECRET_MAX + 1]) {
    return ct__auth_read_secret_at(AT_FDCWD, path, out);
}

bool ct__auth_secret_given(void) {
    pthread_mutex_lock(&secret_mu);
    bool given = secret_origin ? strcmp(secret_origin, RANDOM_ORIGIN) != 0
                               : getenv("CT_JOB_SECRET") || getenv("CT_SECRET_FILE");
    pthread_mutex_unlock(&secret_mu);
    return given;
}

/* Fills in the secret when nothing has yet; under secret_mu. */
static int find_secret(void) {
    if (secret_origin)
        return 0;
    const char *env = getenv("CT_JOB_SECRET");
    if (env)
        return store_secret(env, strlen(env), "CT_JOB_SECRET");
    const char *file = getenv("CT_SECRET_FILE");
    char buf[CT_SECRET_MAX + 1];
    if (file) {
        int rc = ct_secret_read_file(file, buf);
        return rc ? rc : store_secret(buf, strlen(buf), "CT_SECRET_FILE");
    }
    int rc = ct_secret_generate(buf);
    return rc ? rc : store_secret(buf, strlen(buf), RANDOM_ORIGIN);
}

int ct__auth_secret_copy(char out[CT_SECRET_MAX + 1]) {
    pthread_mutex_lock(&secret_mu);
    int rc = find_secret();
    if (!rc)
        memcpy(out, secret, secret_len + 1);
    pthread_mutex_unlock(&secret_mu);
    return rc;
}

static int setopt_text(void *sock, int opt, const char *value) {
    return zmq_setsockopt(sock, opt, value, strlen(value));
}

int ct__auth_client(void *sock, const char *user) {
    char s[CT_SECRET_MAX + 1];
    int rc = ct__auth_secret_copy(s);
    if (rc)
        return rc;
    if (setopt_text(sock, ZMQ_PLAIN_USERNAME, user) || setopt_text(sock, ZMQ_PLAIN_PASSWORD, s))
        rc = ct__err_set(CT_EFOREIGN, "auth: cannot set zmq's credentials: %s",
                         zmq_strerror(zmq_errno()));
    memset(s, 0, sizeof s);
    return rc;
}

int ct__auth_listen(void *ctx, void *sock, ct__auth *a, const char *who) {
    *a = (ct__auth){.who = who};
    int rc = ct__auth_secret_copy(a->secret);
    if (rc)
        return rc;
    int one = 1, zero = 0;
    size_t fd_len = sizeof a->fd;
    if (!(a->zap = zmq_socket(ctx, ZMQ_REP)) ||
        zmq_setsockopt(a->zap, ZMQ_LINGER, &zero, sizeof zero) || zmq_bind(a->zap, ZAP_ENDPOINT) ||
        zmq_getsockopt(a->zap, ZMQ_FD, &a->fd, &fd_len) ||
        zmq_setsockopt(sock, ZMQ_PLAIN_SERVER, &one, sizeof one) ||
        setopt_text(sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN)) {
        rc = ct__err_set(CT_EFOREIGN, "%s: cannot set up authentication: %s", who,
                         zmq_strerror(zmq_errno()));
        ct__auth_close(a);
    }
    return rc;
}

void ct__auth_close(ct__auth *a) {
    if (a->zap)
        zmq_close(a->zap);
    memset(a->secret, 0, sizeof a->secret);
    a->zap = NULL;
}

static bool same_secret(const void *got, size_t len, const char *want) {
    size_t wlen = strlen(want);
    unsigned char diff = len != wlen;
    const unsigned char *g = got;
    for (size_t i = 0; i < wlen; i++)
        diff |= (unsigned char)(want[i] ^ (i < len ? g[i] : 0));
    return diff == 0;
}

/* ZAP's request frames (RFC 27): version, request id, domain, address,
 * routing id, mechanism, then the mechanism's credentials. */
enum {
    ZAP_VERSION,
    ZAP_ID,
    ZAP_DOMAIN_F,
    ZAP_ADDRESS,
    ZAP_ROUTING,
    ZAP_MECH,
    ZAP_USER,
    ZAP_PASS,
    ZAP_NFRAMES
};

static void log_refusal(ct__auth *a, const char *address, const char *why) {
    double now = ct__now();
    a->refused++;
    if (a->logged_at && now - a->logged_at < REFUSAL_LOG_S) {
        a->unlogged++;
        return;
    }
    char more[64] = "";
    if (a->unlogged)
        snprintf(more, sizeof more, " (and %llu more since the last report)",
                 (unsigned long long)a->unlogged);
    fprintf(stderr, "ct: %s refused a connection from %s: %s%s\n", a->who, address, why, more);
    a->logged_at = now;
    a->unlogged = 0;
}

/* Answers one waiting ZAP request; false when none is waiting. */
static bool serve_one(ct__auth *a) {
    zmq_msg_t f[ZAP_NFRAMES + 1];
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t *m = &f[n < ZAP_NFRAMES ? n : ZAP_NFRAMES];
        zmq_msg_init(m);
        if (ct__dist_zmq_recv(m, a->zap, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            break;
        }
        more = zmq_msg_more(m);
        if (n < ZAP_NFRAMES)
            n++;
        else
            zmq_msg_close(m);
    }
    if (n == 0)
        return false;
    char address[64] = "?";
    if (n > ZAP_ADDRESS)
        snprintf(address, sizeof address, "%.*s", (int)zmq_msg_size(&f[ZAP_ADDRESS]),
                 (const char *)zmq_msg_data(&f[ZAP_ADDRESS]));
    const char *why = NULL;
    if (n < ZAP_NFRAMES || zmq_msg_size(&f[ZAP_MECH]) != 5 ||
        memcmp(zmq_msg_data(&f[ZAP_MECH]), "PLAIN", 5) != 0)
        why = "no credentials (is it a ct process of this job?)";
    else if (!same_secret(zmq_msg_data(&f[ZAP_PASS]), zmq_msg_size(&f[ZAP_PASS]), a->secret))
        why = "wrong job secret (CT_JOB_SECRET, CT_SECRET_FILE or --secret-file differ)";
    if (why)
        log_refusal(a, address, why);
    else
        a->accepted++;
    /* The reply: version, request id, status code and text, user id, metadata. The user id is
     * the name the client gave, which zmq attaches to its messages as "User-Id". */
    const char *code = why ? "400" : "200";
    zmq_send(a->zap, "1.0", 3, ZMQ_SNDMORE);
    if (n > ZAP_ID)
        zmq_send(a->zap, zmq_msg_data(&f[ZAP_ID]), zmq_msg_size(&f[ZAP_ID]), ZMQ_SNDMORE);
    else
        zmq_send(a->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(a->zap, code, 3, ZMQ_SNDMORE);
    zmq_send(a->zap, why ? "refused" : "OK", why ? 7 : 2, ZMQ_SNDMORE);
    if (!why)
        zmq_send(a->zap, zmq_msg_data(&f[ZAP_USER]), zmq_msg_size(&f[ZAP_USER]), ZMQ_SNDMORE);
    else
        zmq_send(a->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(a->zap, "", 0, 0);
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
    return true;
}

void ct__auth_serve(ct__auth *a) {
    while (serve_one(a))
        ;
}
