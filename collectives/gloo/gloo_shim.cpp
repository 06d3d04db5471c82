// The C++ side of the gloo backend: libgloo's context, rendezvous and
// algorithms behind the C functions of gloo_shim.h. It holds no policy:
// what to run, in which type, and what an error means for the
// communicator is gloo.c's. Every entry point catches every exception.
#include "gloo_shim.h"

#include <ct/tensor.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <vector>

namespace {

using ms = std::chrono::milliseconds;
namespace tcp = gloo::transport::tcp;

// A failed store call, with ct's code.
struct StoreError : std::runtime_error {
    int code;
    StoreError(int code, const std::string &what) : std::runtime_error(what), code(code) {}
};

// gloo's rendezvous over ct's store, every key under the prefix.
class CtStore : public gloo::rendezvous::Store {
  public:
    CtStore(const ct__gloo_store &s, ms timeout) : s_(s), timeout_(timeout) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        int rc = s_.set(s_.ctx, full(key).c_str(), data.data(), data.size());
        if (rc)
            throw StoreError(rc, "store set '" + full(key) + "': " + ct_errmsg());
    }

    std::vector<char> get(const std::string &key) override {
        void *value = nullptr;
        size_t len = 0;
        int rc = s_.get(s_.ctx, full(key).c_str(), timeout_.count() / 1e3, &value, &len);
        if (rc)
            throw StoreError(rc, "store get '" + full(key) + "': " + ct_errmsg());
        std::vector<char> out(static_cast<char *>(value), static_cast<char *>(value) + len);
        free(value);
        return out;
    }

    void wait(const std::vector<std::string> &keys) override { wait(keys, timeout_); }

    void wait(const std::vector<std::string> &keys, const ms &timeout) override {
        for (const auto &key : keys) {
            void *value = nullptr;
            size_t len = 0;
            int rc = s_.get(s_.ctx, full(key).c_str(), timeout.count() / 1e3, &value, &len);
            free(value);
            if (rc)
                throw StoreError(rc, "store wait '" + full(key) + "': " + ct_errmsg());
        }
    }

  private:
    std::string full(const std::string &key) const { return s_.prefix + key; }
    const ct__gloo_store &s_;
    ms timeout_;
};

} // namespace

// Debian's libgloo-dev lacks gloo/common/memory.h, which the tcp
// transport's pair.h and context.h include, so the shim sees pairs only
// through the generic interface: their own address once connected
// ("[ip]:port"). gloo's messages on the other side name one of two
// addresses of this end: that one, or, where this end connected before
// the other side began its own connect (gloo's Pair::connect then
// overwrites the address it read from the socket with the one from the
// rendezvous), this end's listening address, which the rendezvous holds.
struct ct__gloo_ctx {
    std::shared_ptr<gloo::rendezvous::Context> context;
    int rank = 0, size = 0;
    void *store_ctx = nullptr;
    int (*store_get)(void *, const char *, double, void **, size_t *) = nullptr;
    std::string prefix;
    std::vector<std::string> self; // per rank: this end's address of the pair, "" for this rank
    std::mutex mu;                 // guards peers
    // per rank: the far end's two addresses, read on the first failure
    std::vector<std::vector<std::string>> peers;
};

struct ct__gloo_buf {
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    ct__gloo_ctx *ctx;
    int peer;
    bool send;
};

namespace {

void put_err(char *err, const char *what) { snprintf(err, CT__GLOO_ERR_LEN, "%s", what); }

// The key under which a rank publishes its ends' addresses.
std::string addr_key(const std::string &prefix, int rank) {
    return prefix + "addr/" + std::to_string(rank);
}

// Every peer's end of its connection to this rank, from what the peers
// published at connect time: read once, on the first broken connection.
// The keys are there since the connect, but the store client is shared
// with the other thread's calls (a slow machine, a sanitizer): 5 s for each.
void load_peers(ct__gloo_ctx *ctx) {
    if (!ctx->peers.empty())
        return;
    ctx->peers.resize((size_t)ctx->size);
    for (int r = 0; r < ctx->size; r++) {
        void *value = nullptr;
        size_t len = 0;
        if (r == ctx->rank ||
            ctx->store_get(ctx->store_ctx, addr_key(ctx->prefix, r).c_str(), 5.0, &value, &len)) {
            free(value);
            continue;
        }
        // One line per rank, of addresses separated by spaces; this
        // rank's is the rank-th.
        std::istringstream lines(std::string(static_cast<char *>(value), len));
        free(value);
        std::string line, addr;
        for (int i = 0; i <= ctx->rank && std::getline(lines, line); i++)
            if (i == ctx->rank)
                for (std::istringstream words(line); words >> addr;)
                    ctx->peers[(size_t)r].push_back(addr);
    }
}

// The rank whose end gloo's message names, or -1. An address is
// "[ip]:port"; a digit after the match would make it another port.
int rank_named(ct__gloo_ctx *ctx, const char *what) {
    if (!ctx)
        return -1;
    std::lock_guard<std::mutex> lock(ctx->mu);
    load_peers(ctx);
    for (size_t r = 0; r < ctx->peers.size(); r++)
        for (const std::string &p : ctx->peers[r])
            for (const char *at = strstr(what, p.c_str()); at; at = strstr(at + 1, p.c_str()))
                if (at[p.size()] < '0' || at[p.size()] > '9')
                    return (int)r;
    return -1;
}

// gloo says "timeout" or "Timed out" in every timeout it raises.
bool says_timeout(const char *what) { return strstr(what, "imeout") || strstr(what, "imed out"); }

// Runs f, turning whatever it throws into a code and err; *peer (when not
// NULL) names the rank of a broken connection.
template <typename F> int guard(ct__gloo_ctx *ctx, int *peer, char *err, F &&f) {
    if (peer)
        *peer = -1;
    try {
        f();
        return 0;
    } catch (const StoreError &e) {
        put_err(err, e.what());
        return e.code;
    } catch (const gloo::IoException &e) {
        put_err(err, e.what());
        if (says_timeout(e.what()))
            return CT_ETIMEDOUT;
        if (peer)
            *peer = rank_named(ctx, e.what());
        return CT_EPEER;
    } catch (const std::bad_alloc &) {
        put_err(err, "out of memory");
        return CT_ENOMEM;
    } catch (const std::exception &e) {
        put_err(err, e.what());
        return says_timeout(e.what()) ? CT_ETIMEDOUT : CT_EFOREIGN;
    } catch (...) {
        put_err(err, "an unknown C++ exception");
        return CT_EFOREIGN;
    }
}

ms to_ms(int64_t timeout_ms) { return ms(timeout_ms > 0 ? timeout_ms : 1); }

// gloo's templates take an element type; only its size matters for moves
// and for the reduction, which the caller's function carries out.
template <typename F> void by_size(size_t esize, F &&f) {
    switch (esize) {
    case 1: f(static_cast<uint8_t *>(nullptr)); break;
    case 2: f(static_cast<uint16_t *>(nullptr)); break;
    case 4: f(static_cast<uint32_t *>(nullptr)); break;
    case 8: f(static_cast<uint64_t *>(nullptr)); break;
    default: throw std::invalid_argument("element size " + std::to_string(esize));
    }
}

} // namespace

extern "C" {

int ct__gloo_connect(const ct__gloo_store *store, const char *addr, int rank, int size,
                     int64_t timeout_ms, ct__gloo_ctx **out, int *peer, char *err) {
    *out = nullptr;
    ct__gloo_ctx *ctx = nullptr;
    int rc = guard(nullptr, peer, err, [&] {
        std::unique_ptr<ct__gloo_ctx> c(new ct__gloo_ctx);
        c->rank = rank;
        c->size = size;
        c->store_ctx = store->ctx;
        c->store_get = store->get;
        c->prefix = store->prefix;
        tcp::attr attr(addr);
        // The device's event loop thread writes to the sockets too, with
        // writev and no MSG_NOSIGNAL: a peer that closed its end would
        // kill the process with SIGPIPE. The thread inherits this one's
        // mask, so every signal is blocked around its start, as for the
        // lanes (gloo.c); a write then fails with EPIPE, which gloo
        // reports as a broken connection.
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        std::shared_ptr<gloo::transport::Device> dev;
        try {
            dev = tcp::CreateDevice(attr);
        } catch (...) {
            pthread_sigmask(SIG_SETMASK, &old, nullptr);
            throw;
        }
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        c->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        c->context->setTimeout(to_ms(timeout_ms));
        CtStore s(*store, to_ms(timeout_ms));
        c->context->connectFullMesh(s, dev);
        // The rendezvous holds this rank's listening addresses, one per
        // peer in rank order, this rank left out, each of the same size.
        std::vector<char> listening = s.get(std::to_string(rank));
        size_t each = size > 1 ? listening.size() / (size_t)(size - 1) : 0;
        std::string lines;
        c->self.resize((size_t)size);
        for (int r = 0; r < size; r++) {
            if (r != rank) {
                auto at = listening.begin() + (ptrdiff_t)(each * (size_t)(r < rank ? r : r - 1));
                c->self[(size_t)r] = c->context->getPair(r)->address().str();
                lines += c->self[(size_t)r] + " " +
                         tcp::Address(std::vector<char>(at, at + (ptrdiff_t)each)).str();
            }
            lines += "\n";
        }
        s.set("addr/" + std::to_string(rank), std::vector<char>(lines.begin(), lines.end()));
        ctx = c.release();
    });
    *out = ctx;
    return rc;
}

// gloo's closeConnections does not wake a thread waiting inside a
// collective (only a pair's own failure does), and the transport context's
// signalException, which would, is protected. shutdown(2) on each
// connection's socket is such a failure: gloo's event loop reads end of
// file and fails every operation pending on the pair, on both ends. The
// sockets are found by their local address; the descriptors stay gloo's
// to close.
void ct__gloo_ctx_close(ct__gloo_ctx *ctx) {
    char err[CT__GLOO_ERR_LEN];
    guard(ctx, nullptr, err, [&] {
        DIR *d = opendir("/proc/self/fd");
        if (!d)
            return;
        while (struct dirent *e = readdir(d)) {
            int fd = atoi(e->d_name);
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            if (e->d_name[0] == '.' || fd == dirfd(d) ||
                getsockname(fd, (struct sockaddr *)&ss, &len) != 0 ||
                (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
                continue;
            std::string self = tcp::Address((const struct sockaddr *)&ss, len).str();
            for (const auto &mine : ctx->self)
                if (!mine.empty() && mine == self)
                    shutdown(fd, SHUT_RDWR);
        }
        closedir(d);
    });
}

void ct__gloo_ctx_free(ct__gloo_ctx *ctx) {
    if (!ctx)
        return;
    char err[CT__GLOO_ERR_LEN];
    guard(ctx, nullptr, err, [&] { ctx->context->closeConnections(); });
    guard(ctx, nullptr, err, [&] { delete ctx; });
}

int ct__gloo_allreduce(ct__gloo_ctx *ctx, void *buf, size_t count, size_t esize,
                       ct__gloo_reduce_fn fn, void *fn_ctx, int64_t timeout_ms, int *peer,
                       char *err) {
    return guard(ctx, peer, err, [&] {
        gloo::AllreduceOptions opts(ctx->context);
        by_size(esize,
                [&](auto *type) { opts.setOutput(static_cast<decltype(type)>(buf), count); });
        opts.setReduceFunction([fn, fn_ctx](void *o, const void *a, const void *b, size_t n) {
            fn(fn_ctx, o, a, b, n);
        });
        opts.setTimeout(to_ms(timeout_ms));
        gloo::allreduce(opts);
    });
}

int ct__gloo_reduce(ct__gloo_ctx *ctx, void *buf, size_t count, size_t esize, int root,
                    ct__gloo_reduce_fn fn, void *fn_ctx, int64_t timeout_ms, int *peer, char *err) {
    return guard(ctx, peer, err, [&] {
        gloo::ReduceOptions opts(ctx->context);
        by_size(esize,
                [&](auto *type) { opts.setOutput(static_cast<decltype(type)>(buf), count); });
        opts.setRoot(root);
        opts.setReduceFunction([fn, fn_ctx](void *o, const void *a, const void *b, size_t n) {
            fn(fn_ctx, o, a, b, n);
        });
        opts.setTimeout(to_ms(timeout_ms));
        gloo::reduce(opts);
    });
}

int ct__gloo_broadcast(ct__gloo_ctx *ctx, void *buf, size_t count, size_t esize, int root,
                       int64_t timeout_ms, int *peer, char *err) {
    return guard(ctx, peer, err, [&] {
        gloo::BroadcastOptions opts(ctx->context);
        by_size(esize,
                [&](auto *type) { opts.setOutput(static_cast<decltype(type)>(buf), count); });
        opts.setRoot(root);
        opts.setTimeout(to_ms(timeout_ms));
        gloo::broadcast(opts);
    });
}

int ct__gloo_allgather(ct__gloo_ctx *ctx, const void *in, void *out, size_t count, size_t esize,
                       int64_t timeout_ms, int *peer, char *err) {
    return guard(ctx, peer, err, [&] {
        gloo::AllgatherOptions opts(ctx->context);
        size_t n = (size_t)ctx->context->size;
        by_size(esize, [&](auto *type) {
            using T = std::remove_pointer_t<decltype(type)>;
            // In place (in is this rank's block of out): gloo's in-place
            // form, which takes no input and copies nothing.
            if (static_cast<const char *>(in) !=
                static_cast<char *>(out) + (size_t)ctx->context->rank * count * esize)
                opts.setInput(const_cast<T *>(static_cast<const T *>(in)), count);
            opts.setOutput(static_cast<T *>(out), count * n);
        });
        opts.setTimeout(to_ms(timeout_ms));
        gloo::allgather(opts);
    });
}

int ct__gloo_alltoall(ct__gloo_ctx *ctx, const void *in, void *out, size_t count, size_t esize,
                      int64_t timeout_ms, int *peer, char *err) {
    return guard(ctx, peer, err, [&] {
        gloo::AlltoallOptions opts(ctx->context);
        by_size(esize, [&](auto *type) {
            using T = std::remove_pointer_t<decltype(type)>;
            opts.setInput(const_cast<T *>(static_cast<const T *>(in)), count);
            opts.setOutput(static_cast<T *>(out), count);
        });
        opts.setTimeout(to_ms(timeout_ms));
        gloo::alltoall(opts);
    });
}

int ct__gloo_barrier(ct__gloo_ctx *ctx, int64_t timeout_ms, int *peer, char *err) {
    return guard(ctx, peer, err, [&] {
        gloo::BarrierOptions opts(ctx->context);
        opts.setTimeout(to_ms(timeout_ms));
        gloo::barrier(opts);
    });
}

static int post(ct__gloo_ctx *ctx, void *buf, size_t bytes, int peer_rank, uint64_t slot, bool send,
                ct__gloo_buf **out, char *err) {
    *out = nullptr;
    ct__gloo_buf *b = nullptr;
    int rc = guard(ctx, nullptr, err, [&] {
        std::unique_ptr<ct__gloo_buf> p(new ct__gloo_buf{nullptr, ctx, peer_rank, send});
        p->buf = ctx->context->createUnboundBuffer(buf, bytes);
        if (send)
            p->buf->send(peer_rank, slot);
        else
            p->buf->recv(peer_rank, slot);
        b = p.release();
    });
    *out = b;
    return rc;
}

int ct__gloo_post_send(ct__gloo_ctx *ctx, const void *buf, size_t bytes, int peer_rank,
                       uint64_t slot, ct__gloo_buf **out, char *err) {
    return post(ctx, const_cast<void *>(buf), bytes, peer_rank, slot, true, out, err);
}

int ct__gloo_post_recv(ct__gloo_ctx *ctx, void *buf, size_t bytes, int peer_rank, uint64_t slot,
                       ct__gloo_buf **out, char *err) {
    return post(ctx, buf, bytes, peer_rank, slot, false, out, err);
}

int ct__gloo_buf_wait(ct__gloo_buf *b, int64_t timeout_ms, int *peer, char *err) {
    int rc = guard(b->ctx, peer, err, [&] {
        if (b->send)
            b->buf->waitSend(to_ms(timeout_ms));
        else
            b->buf->waitRecv(to_ms(timeout_ms));
    });
    // The buffer has one peer: a broken connection is that one's.
    if (rc == CT_EPEER && peer)
        *peer = b->peer;
    return rc;
}

void ct__gloo_buf_free(ct__gloo_buf *b) {
    char err[CT__GLOO_ERR_LEN];
    guard(b ? b->ctx : nullptr, nullptr, err, [&] { delete b; });
}

} // extern "C"
