// iwpeer - a small iWARP verbs peer (librdmacm + libibverbs) for the oxrdma interop lab.
//
//   iwpeer server ADDR PORT [--size MAX] [--timeout S] [-q]
//   iwpeer client ADDR PORT [--ops send,sendinv,write,read] [--size N] [--iters N]
//                           [--drive client|server|both] [--timeout S] [-q]
//
// One RC connection through rdma_cm.  The client says in its HELLO which ops to run, with
// which size, how many times and who drives them; the server follows.  The peer protocol is
// documented in interop/README.md ("iwpeer protocol") so that oxrdma can implement the
// same peer.  Output: one line per op and driver, "OK <op> <size> iters=<n> by=<role>" or
// "FAIL <op> <size> ...", then "PASS" or "FAIL"; exit status 0 on PASS, 1 on a failed op,
// 2 on a setup/connection error or timeout.
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/resource.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define MAGIC 0x49575031u /* "IWP1" */
#define HDR_LEN 32
#define NRECV 8

enum op { OP_SEND = 1, OP_SENDINV = 2, OP_WRITE = 3, OP_READ = 4 };
static const char *op_name[] = {"?", "send", "sendinv", "write", "read"};
enum msg {
    M_HELLO = 1, M_DATA = 2, M_ACK = 3, M_INVKEY_REQ = 4, M_INVKEY = 5,
    M_WROTE = 6, M_FILL = 7, M_FILLED = 8, M_DONE = 9, M_NAK = 10,
};
enum { DRIVE_CLIENT = 1, DRIVE_SERVER = 2 };

// Control header, big-endian on the wire; first HDR_LEN bytes of every Send.
struct hdr {
    uint32_t magic;
    uint16_t type;
    uint8_t op;
    uint8_t flags;
    uint32_t iter;
    uint32_t len;
    uint64_t addr;
    uint32_t rkey;
    uint32_t arg;
};

static void put_hdr(uint8_t *b, const struct hdr *h) {
    uint32_t v32; uint16_t v16; uint64_t v64;
    v32 = htobe32(MAGIC); memcpy(b + 0, &v32, 4);
    v16 = htobe16(h->type); memcpy(b + 4, &v16, 2);
    b[6] = h->op; b[7] = h->flags;
    v32 = htobe32(h->iter); memcpy(b + 8, &v32, 4);
    v32 = htobe32(h->len); memcpy(b + 12, &v32, 4);
    v64 = htobe64(h->addr); memcpy(b + 16, &v64, 8);
    v32 = htobe32(h->rkey); memcpy(b + 24, &v32, 4);
    v32 = htobe32(h->arg); memcpy(b + 28, &v32, 4);
}

static int get_hdr(const uint8_t *b, uint32_t n, struct hdr *h) {
    uint32_t v32; uint16_t v16; uint64_t v64;
    if (n < HDR_LEN) return -1;
    memcpy(&v32, b, 4); h->magic = be32toh(v32);
    if (h->magic != MAGIC) return -1;
    memcpy(&v16, b + 4, 2); h->type = be16toh(v16);
    h->op = b[6]; h->flags = b[7];
    memcpy(&v32, b + 8, 4); h->iter = be32toh(v32);
    memcpy(&v32, b + 12, 4); h->len = be32toh(v32);
    memcpy(&v64, b + 16, 8); h->addr = be64toh(v64);
    memcpy(&v32, b + 24, 4); h->rkey = be32toh(v32);
    memcpy(&v32, b + 28, 4); h->arg = be32toh(v32);
    return 0;
}

// Data pattern: byte i of the payload of op OP in iteration ITER.
static inline uint8_t pat(uint32_t op, uint32_t iter, uint64_t i) {
    return (uint8_t)(i * 131u + (i >> 8) + iter * 17u + op * 59u + 1u);
}
static void fill(uint8_t *p, uint64_t n, uint32_t op, uint32_t iter) {
    for (uint64_t i = 0; i < n; i++) p[i] = pat(op, iter, i);
}
// returns -1 if ok, else first bad offset
static int64_t check(const uint8_t *p, uint64_t n, uint32_t op, uint32_t iter) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != pat(op, iter, i)) return (int64_t)i;
    return -1;
}

static int quiet, warned_inv;
static const char *nak_name(uint32_t c) {
    switch (c) {
    case 1: return "bad length";
    case 2: return "data mismatch";
    case 3: return "plain send arrived with invalidate";
    case 5: return "wrong STag invalidated";
    case 9: return "unknown message type";
    default: return "?";
    }
}
static const char *role;
static void die(const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    printf("FAIL setup: "); vprintf(fmt, ap); printf("\nFAIL\n");
    va_end(ap); fflush(stdout); exit(2);
}
static void info(const char *fmt, ...) {
    if (quiet) return;
    va_list ap; va_start(ap, fmt);
    printf("# %s: ", role); vprintf(fmt, ap); printf("\n");
    va_end(ap); fflush(stdout);
}
static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "FAIL timeout\nFAIL\n";
    if (write(1, m, sizeof m - 1) < 0) {}
    _exit(2);
}

struct peer {
    struct rdma_event_channel *ec;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *scq, *rcq;
    uint32_t bufsz;            // size of rbuf/lbuf and max payload
    uint8_t *rbuf, *lbuf, *sbuf, *recvbuf;
    struct ibv_mr *rmr, *lmr, *smr, *recvmr;
    uint32_t recvsz;
    // peer's target buffer
    uint64_t raddr; uint32_t rrkey, rlen;
    // pending invalidation key (responder side)
    struct ibv_mr *invmr; uint8_t *invbuf;
    int failures;
};

static struct rdma_cm_event *wait_event(struct peer *p, enum rdma_cm_event_type want, int ms) {
    struct pollfd pfd = {.fd = p->ec->fd, .events = POLLIN};
    int r = poll(&pfd, 1, ms);
    if (r <= 0) die("no rdma_cm event (wanted %s) within %d ms", rdma_event_str(want), ms);
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(p->ec, &ev)) die("rdma_get_cm_event: %s", strerror(errno));
    if (ev->event != want)
        die("rdma_cm event %s (status %d), wanted %s", rdma_event_str(ev->event), ev->status,
            rdma_event_str(want));
    return ev;
}

static void post_recv(struct peer *p, uint32_t slot) {
    struct ibv_sge sge = {.addr = (uintptr_t)(p->recvbuf + (uint64_t)slot * p->recvsz),
                          .length = p->recvsz, .lkey = p->recvmr->lkey};
    struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(p->id->qp, &wr, &bad)) die("ibv_post_recv: %s", strerror(errno));
}

static struct ibv_mr *reg(struct peer *p, void *buf, size_t n, int acc) {
    struct ibv_mr *mr = ibv_reg_mr(p->pd, buf, n ? n : 1, acc);
    if (!mr) die("ibv_reg_mr(%zu): %s", n, strerror(errno));
    return mr;
}

static void setup(struct peer *p, struct rdma_cm_id *id) {
    p->id = id;
    p->pd = ibv_alloc_pd(id->verbs);
    if (!p->pd) die("ibv_alloc_pd: %s", strerror(errno));
    p->scq = ibv_create_cq(id->verbs, 32, NULL, NULL, 0);
    p->rcq = ibv_create_cq(id->verbs, 32, NULL, NULL, 0);
    if (!p->scq || !p->rcq) die("ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr qa = {
        .send_cq = p->scq, .recv_cq = p->rcq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
        .cap = {.max_send_wr = 16, .max_recv_wr = NRECV + 2, .max_send_sge = 1,
                .max_recv_sge = 1},
    };
    if (rdma_create_qp(id, p->pd, &qa)) die("rdma_create_qp: %s", strerror(errno));
    size_t n = p->bufsz ? p->bufsz : 1;
    p->rbuf = calloc(1, n); p->lbuf = calloc(1, n);
    p->recvsz = HDR_LEN + p->bufsz;
    p->sbuf = calloc(1, p->recvsz);
    p->recvbuf = calloc(NRECV, p->recvsz);
    if (!p->rbuf || !p->lbuf || !p->sbuf || !p->recvbuf) die("out of memory");
    p->rmr = reg(p, p->rbuf, n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                    IBV_ACCESS_REMOTE_READ);
    // iWARP: the sink of an RDMA Read is named by STag in the Read Request, so it needs
    // remote write access.
    p->lmr = reg(p, p->lbuf, n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    p->smr = reg(p, p->sbuf, p->recvsz, IBV_ACCESS_LOCAL_WRITE);
    p->recvmr = reg(p, p->recvbuf, (size_t)NRECV * p->recvsz, IBV_ACCESS_LOCAL_WRITE);
    for (uint32_t i = 0; i < NRECV; i++) post_recv(p, i);
}

// Wait for one completion on cq. Every ~10 ms also look at the rdma_cm channel: a connection
// that the provider dropped (kernel siw closes the socket on a protocol error, sometimes without
// flushing the queues) ends the run at once with the event's name, instead of spinning here
// until the --timeout alarm while the listener refuses every later connection.
static void poll1(struct peer *p, struct ibv_cq *cq, struct ibv_wc *wc, const char *what) {
    for (unsigned spins = 1;; spins++) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n < 0) die("ibv_poll_cq failed");
        if (n == 1) return;
        if (spins % 500 == 0) {
            struct pollfd pfd = {.fd = p->ec->fd, .events = POLLIN};
            struct rdma_cm_event *ev;
            if (poll(&pfd, 1, 0) > 0 && !rdma_get_cm_event(p->ec, &ev)) {
                enum rdma_cm_event_type t = ev->event; int st = ev->status;
                rdma_ack_cm_event(ev);
                // a completion that raced the event still counts
                if (ibv_poll_cq(cq, 1, wc) == 1) return;
                die("rdma_cm event %s (status %d) while waiting for %s", rdma_event_str(t), st,
                    what);
            }
        }
        usleep(20);
    }
}

static void wait_send(struct peer *p, const char *what) {
    struct ibv_wc wc;
    poll1(p, p->scq, &wc, what);
    if (wc.status != IBV_WC_SUCCESS)
        die("%s completion: %s (vendor_err %u)", what, ibv_wc_status_str(wc.status),
            wc.vendor_err);
}

// post a Send: header + optional payload already in sbuf+HDR_LEN
static void post_send(struct peer *p, const struct hdr *h, uint32_t paylen, int opcode,
                      uint32_t inv) {
    put_hdr(p->sbuf, h);
    struct ibv_sge sge = {.addr = (uintptr_t)p->sbuf, .length = HDR_LEN + paylen,
                          .lkey = p->smr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
                             .opcode = opcode, .send_flags = IBV_SEND_SIGNALED}, *bad;
    if (opcode == IBV_WR_SEND_WITH_INV) {
        wr.invalidate_rkey = inv;
        // libsiw (rdma-core <= 50 at least) copies wr.rdma.rkey, not invalidate_rkey, into
        // the SQE it hands to kernel siw; set both so every provider sends the right STag.
        wr.wr.rdma.rkey = inv;
    }
    if (ibv_post_send(p->id->qp, &wr, &bad)) die("ibv_post_send: %s", strerror(errno));
    wait_send(p, opcode == IBV_WR_SEND_WITH_INV ? "send-with-invalidate" : "send");
}

static void ctrl(struct peer *p, uint16_t type, uint8_t op, uint32_t iter, uint32_t len,
                 uint32_t arg) {
    struct hdr h = {.type = type, .op = op, .iter = iter, .len = len, .arg = arg};
    post_send(p, &h, 0, IBV_WR_SEND, 0);
}

// wait for one received message; returns slot (caller reposts with post_recv)
static uint32_t recv_msg(struct peer *p, struct hdr *h, struct ibv_wc *wc) {
    poll1(p, p->rcq, wc, "a receive");
    if (wc->status != IBV_WC_SUCCESS)
        die("receive completion: %s (vendor_err %u)", ibv_wc_status_str(wc->status),
            wc->vendor_err);
    uint32_t slot = (uint32_t)wc->wr_id;
    if (get_hdr(p->recvbuf + (uint64_t)slot * p->recvsz, wc->byte_len, h))
        die("received %u bytes without an IWP1 header", wc->byte_len);
    return slot;
}

static void rdma_op(struct peer *p, int opcode, uint32_t len) {
    struct ibv_sge sge = {.addr = (uintptr_t)p->lbuf, .length = len, .lkey = p->lmr->lkey};
    struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = opcode,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    wr.wr.rdma.remote_addr = p->raddr;
    wr.wr.rdma.rkey = p->rrkey;
    if (ibv_post_send(p->id->qp, &wr, &bad)) die("ibv_post_send(rdma): %s", strerror(errno));
    wait_send(p, opcode == IBV_WR_RDMA_READ ? "rdma read" : "rdma write");
}

// expect ACK (or NAK) for op; returns 0 on ACK
static int expect_ack(struct peer *p, uint8_t op, uint32_t iter, char *why, size_t whylen) {
    struct hdr h; struct ibv_wc wc;
    uint32_t slot = recv_msg(p, &h, &wc);
    post_recv(p, slot);
    if (h.type == M_ACK && h.op == op && h.iter == iter) return 0;
    if (h.type == M_NAK)
        snprintf(why, whylen, "peer NAK code=%u offset=%u", h.arg, h.len);
    else
        snprintf(why, whylen, "unexpected message type %u op %u iter %u", h.type, h.op, h.iter);
    return -1;
}

// ---- driver: perform the ops against the peer
static void drive(struct peer *p, uint32_t opsmask, uint32_t size, uint32_t iters) {
    for (uint8_t op = OP_SEND; op <= OP_READ; op++) {
        if (!(opsmask & (1u << op))) continue;
        char why[160] = "";
        int ok = 1;
        for (uint32_t it = 0; it < iters && ok; it++) {
            struct hdr h; struct ibv_wc wc; uint32_t slot;
            switch (op) {
            case OP_SEND:
                fill(p->sbuf + HDR_LEN, size, op, it);
                post_send(p, &(struct hdr){.type = M_DATA, .op = op, .iter = it, .len = size},
                          size, IBV_WR_SEND, 0);
                ok = !expect_ack(p, op, it, why, sizeof why);
                break;
            case OP_SENDINV:
                ctrl(p, M_INVKEY_REQ, op, it, 0, 0);
                slot = recv_msg(p, &h, &wc);
                post_recv(p, slot);
                if (h.type != M_INVKEY) {
                    snprintf(why, sizeof why, "expected INVKEY, got type %u", h.type);
                    ok = 0; break;
                }
                fill(p->sbuf + HDR_LEN, size, op, it);
                post_send(p, &(struct hdr){.type = M_DATA, .op = op, .iter = it, .len = size,
                                           .rkey = h.rkey},
                          size, IBV_WR_SEND_WITH_INV, h.rkey);
                ok = !expect_ack(p, op, it, why, sizeof why);
                break;
            case OP_WRITE:
                if (size > p->rlen) { snprintf(why, sizeof why, "peer buffer %u < size", p->rlen); ok = 0; break; }
                fill(p->lbuf, size, op, it);
                rdma_op(p, IBV_WR_RDMA_WRITE, size);
                ctrl(p, M_WROTE, op, it, size, 0);
                ok = !expect_ack(p, op, it, why, sizeof why);
                break;
            case OP_READ:
                if (size > p->rlen) { snprintf(why, sizeof why, "peer buffer %u < size", p->rlen); ok = 0; break; }
                ctrl(p, M_FILL, op, it, size, 0);
                slot = recv_msg(p, &h, &wc);
                post_recv(p, slot);
                if (h.type != M_FILLED || h.iter != it) {
                    snprintf(why, sizeof why, "expected FILLED, got type %u", h.type);
                    ok = 0; break;
                }
                memset(p->lbuf, 0, size);
                rdma_op(p, IBV_WR_RDMA_READ, size);
                int64_t bad = check(p->lbuf, size, op, it);
                if (bad >= 0) {
                    snprintf(why, sizeof why, "read data mismatch at offset %lld iter %u",
                             (long long)bad, it);
                    ok = 0;
                }
                break;
            }
        }
        if (ok) printf("OK %s %u iters=%u by=%s\n", op_name[op], size, iters, role);
        else { printf("FAIL %s %u by=%s: %s\n", op_name[op], size, role, why); p->failures++; }
        fflush(stdout);
    }
    ctrl(p, M_DONE, 0, 0, 0, 0);
    char why[160];
    if (expect_ack(p, 0, 0, why, sizeof why)) die("DONE not acknowledged: %s", why);
}

// ---- responder: serve the peer's ops until DONE
static void respond(struct peer *p) {
    for (;;) {
        struct hdr h; struct ibv_wc wc;
        uint32_t slot = recv_msg(p, &h, &wc);
        uint8_t *msg = p->recvbuf + (uint64_t)slot * p->recvsz;
        uint32_t nak = 0, off = 0;
        int reply = M_ACK;
        switch (h.type) {
        case M_DATA: {
            int inv = (wc.wc_flags & IBV_WC_WITH_INV) != 0;
            int64_t bad;
            if (wc.byte_len != HDR_LEN + h.len) nak = 1, off = wc.byte_len;
            else if ((bad = check(msg + HDR_LEN, h.len, h.op, h.iter)) >= 0) nak = 2, off = (uint32_t)bad;
            else if (h.op == OP_SEND && inv) nak = 3;
            else if (h.op == OP_SENDINV) {
                // libsiw never reports IBV_WC_WITH_INV (its copy_cqe clears wc_flags), so
                // the flag is checked only where the provider reports it.  Kernel siw
                // itself terminates the connection if the STag cannot be invalidated.
                if (inv && (!p->invmr || wc.invalidated_rkey != p->invmr->rkey))
                    nak = 5, off = wc.invalidated_rkey;
                else if (!inv && !warned_inv) {
                    info("provider does not report IBV_WC_WITH_INV; invalidation not observable here");
                    warned_inv = 1;
                }
            }
            if (h.op == OP_SENDINV && p->invmr) {
                ibv_dereg_mr(p->invmr); free(p->invbuf); p->invmr = NULL;
            }
            break;
        }
        case M_INVKEY_REQ:
            if (p->invmr) { ibv_dereg_mr(p->invmr); free(p->invbuf); }
            p->invbuf = calloc(1, 64);
            p->invmr = reg(p, p->invbuf, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                 IBV_ACCESS_REMOTE_READ);
            post_recv(p, slot);
            post_send(p, &(struct hdr){.type = M_INVKEY, .op = h.op, .iter = h.iter,
                                       .rkey = p->invmr->rkey, .len = 64,
                                       .addr = (uintptr_t)p->invbuf}, 0, IBV_WR_SEND, 0);
            continue;
        case M_WROTE: {
            int64_t bad;
            if (h.len > p->bufsz) nak = 1, off = h.len;
            else if ((bad = check(p->rbuf, h.len, h.op, h.iter)) >= 0) nak = 2, off = (uint32_t)bad;
            memset(p->rbuf, 0, p->bufsz);
            break;
        }
        case M_FILL:
            if (h.len > p->bufsz) nak = 1, off = h.len;
            else fill(p->rbuf, h.len, h.op, h.iter);
            reply = M_FILLED;
            break;
        case M_DONE:
            post_recv(p, slot);
            ctrl(p, M_ACK, 0, 0, 0, 0);
            return;
        default:
            nak = 9, off = h.type;
        }
        post_recv(p, slot);
        if (nak) {
            // the responder's verdict on the peer's op is printed too, and fails the run
            printf("FAIL %s %u by=peer: NAK code %u (%s) offset/value %u iter %u\n",
                   op_name[h.op <= 4 ? h.op : 0], h.len, nak, nak_name(nak), off, h.iter);
            p->failures++;
            ctrl(p, M_NAK, h.op, h.iter, off, nak);
        } else {
            ctrl(p, reply, h.op, h.iter, 0, 0);
        }
    }
}

static uint32_t parse_ops(const char *s) {
    uint32_t m = 0;
    char *d = strdup(s), *save = NULL;
    for (char *t = strtok_r(d, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int f = 0;
        for (int op = 1; op <= 4; op++)
            if (!strcmp(t, op_name[op]) || !strcmp(t, "all")) m |= 1u << op, f = 1;
        if (!f) { fprintf(stderr, "unknown op %s\n", t); exit(2); }
    }
    free(d);
    return m;
}

static void usage(void) {
    fprintf(stderr,
            "usage: iwpeer server ADDR PORT [--size MAX] [--timeout S] [-q]\n"
            "       iwpeer client ADDR PORT [--ops send,sendinv,write,read] [--size N]\n"
            "                               [--iters N] [--drive client|server|both]\n"
            "                               [--timeout S] [-q]\n");
    exit(2);
}

static void get_addr(const char *host, const char *port, struct sockaddr_storage *ss) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *res;
    if (getaddrinfo(host, port, &hints, &res)) die("cannot resolve %s:%s", host, port);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
}

static const char *addr_str(struct sockaddr *sa, char *b, size_t n) {
    struct sockaddr_in *s = (struct sockaddr_in *)sa;
    char a[64];
    inet_ntop(AF_INET, &s->sin_addr, a, sizeof a);
    snprintf(b, n, "%s:%u", a, ntohs(s->sin_port));
    return b;
}

int main(int argc, char **argv) {
    if (argc < 4) usage();
    role = argv[1];
    int server = !strcmp(role, "server");
    if (!server && strcmp(role, "client")) usage();
    const char *host = argv[2], *port = argv[3];
    uint32_t ops = parse_ops("send,sendinv,write,read"), iters = 1, drivem = DRIVE_CLIENT | DRIVE_SERVER;
    long size = -1;
    int timeout = 60;
    for (int i = 4; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-q")) { quiet = 1; continue; }
        if (!v) usage();
        i++;
        if (!strcmp(a, "--ops")) ops = parse_ops(v);
        else if (!strcmp(a, "--size")) size = strtol(v, NULL, 0);
        else if (!strcmp(a, "--iters")) iters = (uint32_t)strtoul(v, NULL, 0);
        else if (!strcmp(a, "--timeout")) timeout = atoi(v);
        else if (!strcmp(a, "--drive"))
            drivem = !strcmp(v, "client") ? DRIVE_CLIENT : !strcmp(v, "server") ? DRIVE_SERVER
                   : DRIVE_CLIENT | DRIVE_SERVER;
        else usage();
    }
    if (size < 0) size = server ? (1 << 20) : 4096;
    if (size > (1 << 30)) die("size too large");
    // registered memory is pinned: lift RLIMIT_MEMLOCK (the default 8 MiB is too small)
    struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};
    if (setrlimit(RLIMIT_MEMLOCK, &rl)) info("setrlimit(MEMLOCK): %s", strerror(errno));
    signal(SIGALRM, on_alarm);
    alarm((unsigned)timeout);
    setvbuf(stdout, NULL, _IOLBF, 0);

    struct peer P = {0}, *p = &P;
    p->bufsz = (uint32_t)size;
    p->ec = rdma_create_event_channel();
    if (!p->ec) die("rdma_create_event_channel: %s (is an RDMA device configured?)", strerror(errno));
    struct rdma_cm_id *id;
    if (rdma_create_id(p->ec, &id, NULL, RDMA_PS_TCP)) die("rdma_create_id: %s", strerror(errno));
    struct sockaddr_storage sa;
    get_addr(host, port, &sa);
    struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1,
                                 .retry_count = 7, .rnr_retry_count = 7};
    struct rdma_cm_event *ev;
    char la[80], ra[80];
    if (server) {
        if (rdma_bind_addr(id, (struct sockaddr *)&sa)) die("rdma_bind_addr %s:%s: %s", host, port, strerror(errno));
        if (rdma_listen(id, 1)) die("rdma_listen: %s", strerror(errno));
        printf("LISTENING %s:%s\n", host, port);
        ev = wait_event(p, RDMA_CM_EVENT_CONNECT_REQUEST, timeout * 1000);
        struct rdma_cm_id *cid = ev->id;
        info("connect request: ird %u ord %u private_data_len %u",
             ev->param.conn.responder_resources, ev->param.conn.initiator_depth,
             ev->param.conn.private_data_len);
        rdma_ack_cm_event(ev);
        setup(p, cid);
        if (rdma_accept(cid, &cp)) die("rdma_accept: %s", strerror(errno));
        ev = wait_event(p, RDMA_CM_EVENT_ESTABLISHED, 30000);
        rdma_ack_cm_event(ev);
    } else {
        if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sa, 5000))
            die("rdma_resolve_addr: %s", strerror(errno));
        rdma_ack_cm_event(wait_event(p, RDMA_CM_EVENT_ADDR_RESOLVED, 10000));
        if (rdma_resolve_route(id, 5000)) die("rdma_resolve_route: %s", strerror(errno));
        rdma_ack_cm_event(wait_event(p, RDMA_CM_EVENT_ROUTE_RESOLVED, 10000));
        setup(p, id);
        if (rdma_connect(id, &cp)) die("rdma_connect: %s", strerror(errno));
        ev = wait_event(p, RDMA_CM_EVENT_ESTABLISHED, 30000);
        rdma_ack_cm_event(ev);
    }
    printf("CONNECTED %s -> %s device %s\n",
           addr_str(rdma_get_local_addr(p->id), la, sizeof la),
           addr_str(rdma_get_peer_addr(p->id), ra, sizeof ra),
           ibv_get_device_name(p->id->verbs->device));

    // HELLO exchange: the client speaks first, the server answers.
    struct hdr h; struct ibv_wc wc; uint32_t slot;
    struct hdr mine = {.type = M_HELLO, .addr = (uintptr_t)p->rbuf, .rkey = p->rmr->rkey,
                       .len = p->bufsz};
    if (!server) {
        mine.flags = (uint8_t)drivem; mine.iter = iters; mine.arg = ops;
        post_send(p, &mine, 0, IBV_WR_SEND, 0);
        slot = recv_msg(p, &h, &wc); post_recv(p, slot);
        if (h.type == M_NAK) die("server refused HELLO (code %u: its buffer is %u bytes)", h.arg, h.len);
        if (h.type != M_HELLO) die("expected HELLO, got type %u", h.type);
    } else {
        slot = recv_msg(p, &h, &wc); post_recv(p, slot);
        if (h.type != M_HELLO) die("expected HELLO, got type %u", h.type);
        drivem = h.flags; iters = h.iter; ops = h.arg;
        if (h.len > p->bufsz) {
            ctrl(p, M_NAK, 0, 0, p->bufsz, 1);
            die("client size %u exceeds server buffer %u (--size)", h.len, p->bufsz);
        }
        mine.arg = ops;
        post_send(p, &mine, 0, IBV_WR_SEND, 0);
        size = h.len;
    }
    p->raddr = h.addr; p->rrkey = h.rkey; p->rlen = h.len;
    info("peer buffer addr 0x%llx rkey 0x%x len %u; ops mask 0x%x size %ld iters %u drive %u",
         (unsigned long long)p->raddr, p->rrkey, p->rlen, ops, size, iters, drivem);

    if (drivem & DRIVE_CLIENT) { if (server) respond(p); else drive(p, ops, (uint32_t)size, iters); }
    if (drivem & DRIVE_SERVER) { if (server) drive(p, ops, (uint32_t)size, iters); else respond(p); }

    if (!server) {
        rdma_disconnect(p->id);
        struct pollfd pfd = {.fd = p->ec->fd, .events = POLLIN};
        if (poll(&pfd, 1, 5000) > 0 && !rdma_get_cm_event(p->ec, &ev)) rdma_ack_cm_event(ev);
    } else {
        struct pollfd pfd = {.fd = p->ec->fd, .events = POLLIN};
        if (poll(&pfd, 1, 10000) > 0 && !rdma_get_cm_event(p->ec, &ev)) {
            info("event %s", rdma_event_str(ev->event));
            rdma_ack_cm_event(ev);
        }
        rdma_disconnect(p->id);
    }
    printf("%s\n", p->failures ? "FAIL" : "PASS");
    return p->failures ? 1 : 0;
}
