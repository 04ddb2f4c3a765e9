/* TCP backend, who gets in: with ZINC_JOB_SECRET set (zinc launch makes one
 * per job), every connection to the rendezvous and ring ports is a
 * challenge-response in both directions, keyed MACs (libsodium's
 * crypto_auth, HMAC-SHA512-256) over the peer's nonce, the prover's rank,
 * the world size and the job id, so a process without the secret is
 * refused (and cannot pose as rank 0 either). */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"

#define AUTH_MAGIC 0x5a4e4131u   /* "ZNA1" */
#define NONCE_BYTES 32

_Static_assert(crypto_auth_KEYBYTES == ZN_TCP_KEY_BYTES, "the job secret is one crypto_auth key");
_Static_assert(crypto_auth_BYTES == 32, "HMAC-SHA512-256 tags are 32 bytes");

/* listener -> connector */
typedef struct {
    uint32_t magic, pad;
    unsigned char nonce[NONCE_BYTES];
} auth_challenge;

/* connector -> listener: who it is, its own challenge, its proof */
typedef struct {
    uint32_t magic;
    int32_t rank;
    unsigned char nonce[NONCE_BYTES];
    unsigned char mac[crypto_auth_BYTES];
} auth_answer;

/* listener -> connector: the listener's proof */
typedef struct {
    uint32_t magic, pad;
    unsigned char mac[crypto_auth_BYTES];
} auth_proof;

int zn_comm_tcp_auth_init(zn_tcp_auth *a)
{
    memset(a, 0, sizeof *a);
    const char *s = getenv("ZINC_JOB_SECRET");
    if (!s || !*s)
        return 0;
    size_t len = strlen(s), got = 0;
    const char *end = NULL;
    if (len != 2 * ZN_TCP_KEY_BYTES ||
        sodium_hex2bin(a->key, sizeof a->key, s, len, NULL, &got, &end) || got != sizeof a->key ||
        (end && *end)) {
        sodium_memzero(a->key, sizeof a->key);
        return zn_set_error(ZN_ECONFIG, "environment variable ZINC_JOB_SECRET: expected %d hex "
                            "digits (%d bytes, as zinc launch makes it), found %zu characters%s",
                            2 * ZN_TCP_KEY_BYTES, ZN_TCP_KEY_BYTES, len,
                            len == 2 * ZN_TCP_KEY_BYTES ? " that are not all hex digits" : "");
    }
    if (sodium_init() < 0) {
        sodium_memzero(a->key, sizeof a->key);
        return zn_set_error(ZN_EINTERNAL, "comm/tcp: sodium_init failed (libsodium cannot "
                            "start: no entropy source?)");
    }
    const char *id = getenv("ZINC_JOB_ID");
    if (id && strlen(id) >= sizeof a->job_id) {
        sodium_memzero(a->key, sizeof a->key);
        return zn_set_error(ZN_ECONFIG, "environment variable ZINC_JOB_ID is longer than %zu "
                            "characters", sizeof a->job_id - 1);
    }
    snprintf(a->job_id, sizeof a->job_id, "%s", id ? id : "");
    a->on = 1;
    return 0;
}

void zn_comm_tcp_auth_clear(zn_tcp_auth *a)
{
    sodium_memzero(a, sizeof *a);
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* What a prover MACs: a tag with the protocol version, its role ('C'
 * connector, 'L' listener), the channel, its rank, the world size, the
 * other side's nonce and the job id. The role keeps a listener's proof
 * from being replayed as a connector's. */
static size_t mac_input(const zn_tcp_auth *a, char role, int channel, int rank, int world,
                        const unsigned char *nonce, unsigned char *msg)
{
    size_t n = 0, jl = strlen(a->job_id);
    memcpy(msg, "zinc-tcp-auth-1", 16);
    n = 16;
    msg[n++] = (unsigned char)role;
    msg[n++] = (unsigned char)channel;
    put32(msg + n, (uint32_t)rank);
    n += 4;
    put32(msg + n, (uint32_t)world);
    n += 4;
    memcpy(msg + n, nonce, NONCE_BYTES);
    n += NONCE_BYTES;
    msg[n++] = (unsigned char)jl;
    memcpy(msg + n, a->job_id, jl);
    return n + jl;
}

#define MAC_INPUT_MAX (16 + 2 + 8 + NONCE_BYTES + 1 + sizeof ((zn_tcp_auth *)0)->job_id)

static void mac_make(const zn_tcp_auth *a, char role, int channel, int rank, int world,
                     const unsigned char *nonce, unsigned char *mac)
{
    unsigned char msg[MAC_INPUT_MAX];
    size_t n = mac_input(a, role, channel, rank, world, nonce, msg);
    crypto_auth(mac, msg, n, a->key);
}

static int mac_ok(const zn_tcp_auth *a, char role, int channel, int rank, int world,
                  const unsigned char *nonce, const unsigned char *mac)
{
    unsigned char msg[MAC_INPUT_MAX];
    size_t n = mac_input(a, role, channel, rank, world, nonce, msg);
    return crypto_auth_verify(mac, msg, n, a->key) == 0;
}

static void say_io(char *why, size_t wlen, int rc, const char *what, double limit_s)
{
    if (rc == ZN_ETIMEOUT)
        snprintf(why, wlen, "it sent no complete %s within %.1f s (stalled mid-handshake)", what,
                 limit_s);
    else if (rc == -ECONNRESET)
        snprintf(why, wlen, "it closed the connection before its %s was complete", what);
    else
        snprintf(why, wlen, "%s: %s", what, zn_strerror(rc));
}

int zn_comm_tcp_auth_accept(const zn_tcp_auth *a, int fd, int channel, int self, int world,
                            int expect, uint64_t deadline, int *rank, char *why, size_t wlen)
{
    uint64_t now = zn_now_ns();
    uint64_t dl = now + (uint64_t)(ZN_TCP_AUTH_S * 1e9);
    if (dl > deadline)
        dl = deadline;
    double limit_s = (double)(dl - now) / 1e9;
    auth_challenge ch = { AUTH_MAGIC, 0, { 0 } };
    randombytes_buf(ch.nonce, sizeof ch.nonce);
    int rc = zn_comm_tcp_io_all(fd, &ch, sizeof ch, 1, dl);
    if (rc) {
        snprintf(why, wlen, "sending it the challenge: %s", zn_strerror(rc));
        return rc;
    }
    auth_answer ans;
    if ((rc = zn_comm_tcp_io_all(fd, &ans, sizeof ans, 0, dl))) {
        say_io(why, wlen, rc, "answer", limit_s);
        return rc;
    }
    if (ans.magic != AUTH_MAGIC) {
        snprintf(why, wlen, "it sent %zu bytes that are not a zinc handshake", sizeof ans);
        return ZN_ECONFIG;
    }
    int lo = expect >= 0 ? expect : 1, hi = expect >= 0 ? expect : world - 1;
    if (ans.rank < lo || ans.rank > hi || ans.rank == self) {
        snprintf(why, wlen, "it says it is rank %d, which is not a rank expected here", ans.rank);
        return ZN_ECONFIG;
    }
    if (!mac_ok(a, 'C', channel, ans.rank, world, ch.nonce, ans.mac)) {
        snprintf(why, wlen, "its answer (as rank %d) does not prove the job's secret "
                 "(ZINC_JOB_SECRET differs, or it is not one of the job's ranks)", ans.rank);
        return ZN_ECONFIG;
    }
    auth_proof pr = { AUTH_MAGIC, 0, { 0 } };
    mac_make(a, 'L', channel, self, world, ans.nonce, pr.mac);
    if ((rc = zn_comm_tcp_io_all(fd, &pr, sizeof pr, 1, dl))) {
        snprintf(why, wlen, "sending it this rank's proof: %s", zn_strerror(rc));
        return rc;
    }
    *rank = ans.rank;
    return 0;
}

int zn_comm_tcp_auth_connect(const zn_tcp_auth *a, int fd, int channel, int self, int world,
                             int peer, uint64_t deadline, const char *who)
{
    auth_challenge ch;
    int rc = zn_comm_tcp_io_all(fd, &ch, sizeof ch, 0, deadline);
    if (rc)
        return zn_set_error(rc, "comm/tcp: the job-secret handshake with %s: waiting for its "
                            "challenge: %s%s", who, zn_strerror(rc),
                            rc == -ECONNRESET ? " (it closed the connection: see its log)" : "");
    if (ch.magic != AUTH_MAGIC)
        return zn_set_error(ZN_ECONFIG, "comm/tcp: %s does not speak the job-secret handshake "
                            "(is ZINC_JOB_SECRET set on every rank?)", who);
    auth_answer ans;
    ans.magic = AUTH_MAGIC;
    ans.rank = self;
    randombytes_buf(ans.nonce, sizeof ans.nonce);
    mac_make(a, 'C', channel, self, world, ch.nonce, ans.mac);
    if ((rc = zn_comm_tcp_io_all(fd, &ans, sizeof ans, 1, deadline)))
        return zn_set_error(rc, "comm/tcp: the job-secret handshake with %s: sending the "
                            "answer: %s", who, zn_strerror(rc));
    auth_proof pr;
    if ((rc = zn_comm_tcp_io_all(fd, &pr, sizeof pr, 0, deadline)))
        return zn_set_error(rc, "comm/tcp: the job-secret handshake with %s: waiting for its "
                            "proof: %s%s", who, zn_strerror(rc),
                            rc == -ECONNRESET ? " (it refused this rank's answer: is "
                            "ZINC_JOB_SECRET the same on every rank? see its log)" : "");
    if (pr.magic != AUTH_MAGIC || !mac_ok(a, 'L', channel, peer, world, ans.nonce, pr.mac))
        return zn_set_error(ZN_ECONFIG, "comm/tcp: %s did not prove that it holds the job's "
                            "secret (ZINC_JOB_SECRET differs, or another process listens "
                            "there)", who);
    return 0;
}
