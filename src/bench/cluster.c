/* The cluster check's own half (zinc launch --check runs `zinc bench
 * cluster` on every rank): each rank's place (host, device, NUMA node, the
 * interface toward its ring neighbour and its speed from sysfs) gathered
 * to every rank, and the verdict on the ring's links that
 * zn_bench_comm_links measured. The collectives and their data checks are
 * comm.c's. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "zinc/bench.h"
#include "zinc/comm.h"
#include "zinc/device.h"
#include "comm/comm-impl.h"

_Static_assert(sizeof(zn_cluster_rank) == 512, "zn_cluster_rank is one 512-byte row");

/* The local address and interface the kernel's route to `peer` uses: a UDP
 * socket connected there sends nothing, and its name is that address. */
static void route_to(const char *peer, char *addr, size_t alen, char *nic, size_t nlen)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM }, *ai = NULL;
    if (getaddrinfo(peer, "9", &hints, &ai) || !ai)
        return;
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage me;
    socklen_t ml = sizeof me;
    int ok = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
             getsockname(fd, (struct sockaddr *)&me, &ml) == 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    if (!ok || getnameinfo((struct sockaddr *)&me, ml, addr, (socklen_t)alen, NULL, 0,
                           NI_NUMERICHOST))
        return;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs))
        return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        char a[INET6_ADDRSTRLEN + 8];
        if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET &&
                             i->ifa_addr->sa_family != AF_INET6))
            continue;
        socklen_t l = i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                         : sizeof(struct sockaddr_in6);
        if (!getnameinfo(i->ifa_addr, l, a, sizeof a, NULL, 0, NI_NUMERICHOST) &&
            !strcmp(a, addr)) {
            snprintf(nic, nlen, "%s", i->ifa_name);
            break;
        }
    }
    freeifaddrs(ifs);
}

/* /sys/class/net/IF/speed in Mb/s; 0 when the interface does not say
 * (loopback answers EINVAL, a link that is down -1). */
static int nic_speed(const char *nic)
{
    char path[128];
    if (!*nic || strchr(nic, '/'))
        return 0;
    snprintf(path, sizeof path, "/sys/class/net/%s/speed", nic);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int v = 0;
    if (fscanf(f, "%d", &v) != 1 || v < 0)
        v = 0;
    fclose(f);
    return v;
}

static void self_place(zn_bench_comm *b, zn_cluster_rank *me)
{
    zn_comm *c = zn_bench_comm_comm(b);
    zn_comm_info info;
    zn_comm_get_info(c, &info);
    memset(me, 0, sizeof *me);
    me->rank = info.rank;
    me->local_rank = info.local_rank;
    me->local_size = info.local_size;
    if (gethostname(me->hostname, sizeof me->hostname - 1))
        snprintf(me->hostname, sizeof me->hostname, "?");
    const char *lh = getenv("ZINC_LAUNCH_HOST");
    snprintf(me->host, sizeof me->host, "%s", lh && *lh ? lh : me->hostname);
    unsigned cpu = 0, node = 0;
    me->numa = syscall(SYS_getcpu, &cpu, &node, NULL) == 0 ? (int)node : -1;
    zn_dev *dev = zn_bench_comm_device(b);
    if (dev) {
        zn_dev_info di;
        zn_dev_get_info(dev, &di);
        if (di.kind == ZN_DEV_HOST)
            snprintf(me->device, sizeof me->device, "host");
        else
            snprintf(me->device, sizeof me->device, "cuda:%d %.48s", di.ordinal, di.name);
        if (di.numa_node >= 0)
            me->numa = di.numa_node;
    } else {
        snprintf(me->device, sizeof me->device, "host buffers");
    }
    /* the right neighbour's address as the TCP backend knows it */
    int right = (info.rank + 1) % info.size;
    const char *peer = info.size > 1 && c->ops && c->ops->peer_addr
                           ? c->ops->peer_addr(c, right) : NULL;
    if (peer && *peer)
        route_to(peer, me->addr, sizeof me->addr, me->nic, sizeof me->nic);
    me->nic_mbps = nic_speed(me->nic);
}

int zn_bench_cluster_ranks(zn_bench_comm *b, zn_cluster_rank *out)
{
    zn_comm *c = zn_bench_comm_comm(b);
    int rank = zn_comm_rank(c), world = zn_comm_size(c);
    zn_cluster_rank me;
    self_place(b, &me);
    /* one 512-byte row per rank (128 f32 elements: an all-gather copies) */
    memcpy(&out[rank], &me, sizeof me);
    int rc = zn_comm_allgather(c, &out[rank], out, sizeof me / 4, ZN_DTYPE_F32);
    if (rc)
        return zn_error_prefix(rc, "gathering every rank's place");
    for (int r = 0; r < world; r++) {
        zn_cluster_rank *x = &out[r];
        x->host[sizeof x->host - 1] = x->hostname[sizeof x->hostname - 1] = 0;
        x->device[sizeof x->device - 1] = x->addr[sizeof x->addr - 1] = 0;
        x->nic[sizeof x->nic - 1] = 0;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int zn_bench_cluster_judge(const zn_cluster_rank *ranks, const zn_bench_link_row *links,
                           int world, zn_cluster_link_verdict *v, int *slow_host)
{
    double *others = calloc((size_t)world + 1, sizeof *others);
    int n_slow = 0;
    for (int r = 0; r < world; r++) {
        const zn_cluster_rank *a = &ranks[links[r].from], *b = &ranks[links[r].to];
        v[r] = (zn_cluster_link_verdict){ 0 };
        v[r].network = strcmp(a->host, b->host) != 0;
        /* the interface measured: the sender's toward its right
         * neighbour, the receiver (zn_cluster_rank.nic) */
        if (v[r].network && a->nic_mbps > 0)
            v[r].nic_gbs = a->nic_mbps / 8000.0;
    }
    for (int r = 0; r < world && others; r++) {
        if (!v[r].network)
            continue;
        int n = 0;
        for (int k = 0; k < world; k++)
            if (k != r && v[k].network)
                others[n++] = links[k].gbs;
        if (n) {
            qsort(others, (size_t)n, sizeof *others, cmp_double);
            v[r].peers_gbs = n % 2 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2;
        }
        v[r].slow = (v[r].peers_gbs > 0 && links[r].gbs < ZN_CLUSTER_SLOW_PEERS * v[r].peers_gbs) ||
                    (v[r].nic_gbs > 0 && links[r].gbs < ZN_CLUSTER_SLOW_NIC * v[r].nic_gbs);
        n_slow += v[r].slow;
    }
    free(others);
    if (slow_host)
        for (int r = 0; r < world; r++) {
            /* every network link touching r's host, in and out */
            int touch = 0, slow = 0;
            for (int k = 0; k < world; k++) {
                if (!v[k].network)
                    continue;
                if (!strcmp(ranks[links[k].from].host, ranks[r].host) ||
                    !strcmp(ranks[links[k].to].host, ranks[r].host)) {
                    touch++;
                    slow += v[k].slow;
                }
            }
            slow_host[r] = touch >= 2 && slow == touch;
        }
    return n_slow;
}
