/*
 * The UCX calls the rack makes, behind functions whose arguments are plain numbers and
 * pointers, so that the Rust side (sys.rs) declares no UCX structure: the parameter structs
 * below are filled by the C compiler against the system's own <ucp/api/ucp.h>, so a layout
 * the Rust side got wrong cannot exist. The functions return a ucs_status_t (0 is UCS_OK,
 * negative an error; ucs_status_string names it), unless they say otherwise.
 */
#include <string.h>
#include <ucp/api/ucp.h>

/* The one active-message id every link's frames travel under; a link is named by the
 * header (sys.rs). */
#define GSM_AM_ID 0x6a5

typedef void (*gsm_arrived_fn)(void *arg, const void *header, size_t header_length,
                               const void *data, size_t length, int rendezvous);
typedef void (*gsm_failed_fn)(void *arg, void *ep, int status);

const char *gsm_ucx_status_string(int status) {
    return ucs_status_string((ucs_status_t)status);
}

int gsm_ucx_init(ucp_context_h *context) {
    ucp_config_t *config;
    ucs_status_t status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        return status;
    }
    /* Atomics by the CPU that owns the memory (its shared-memory transports, or the
     * target's worker), never the NIC's own: a region's owner updates its words with CPU
     * atomics, which a NIC's atomics are not atomic against (region's memory model). */
    status = ucp_config_modify(config, "ATOMIC_MODE", "cpu");
    /* A region heap UCX allocates must read as zeros: every method but `heap` (malloc) gives
     * fresh pages. */
    if (status == UCS_OK) {
        status = ucp_config_modify(config, "ALLOC_PRIO", "md:sysv,md:posix,huge,thp,mmap");
    }
    if (status != UCS_OK) {
        ucp_config_release(config);
        return status;
    }
    ucp_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA | UCP_FEATURE_AMO64;
    status = ucp_init(&params, config, context);
    ucp_config_release(config);
    return status;
}

int gsm_ucx_worker_create(ucp_context_h context, ucp_worker_h *worker) {
    ucp_worker_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
    /* Made on a bootstrap thread, then used by its gossamer worker alone. */
    params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    params.events = UCP_WAKEUP_RX | UCP_WAKEUP_TX;
    return ucp_worker_create(context, &params, worker);
}

int gsm_ucx_worker_address(ucp_worker_h worker, void **address, size_t *length) {
    return ucp_worker_get_address(worker, (ucp_address_t **)address, length);
}

void gsm_ucx_worker_release_address(ucp_worker_h worker, void *address) {
    ucp_worker_release_address(worker, (ucp_address_t *)address);
}

int gsm_ucx_worker_efd(ucp_worker_h worker, int *fd) {
    return ucp_worker_get_efd(worker, fd);
}

/* 0: armed; 1: events wait (progress before sleeping); else an error. */
int gsm_ucx_worker_arm(ucp_worker_h worker) {
    ucs_status_t status = ucp_worker_arm(worker);
    return status == UCS_ERR_BUSY ? 1 : status;
}

unsigned gsm_ucx_worker_progress(ucp_worker_h worker) {
    return ucp_worker_progress(worker);
}

struct gsm_handler {
    gsm_arrived_fn arrived;
    void *arg;
};

static ucs_status_t gsm_am_arrived(void *arg, const void *header, size_t header_length,
                                   void *data, size_t length, const ucp_am_recv_param_t *param) {
    struct gsm_handler *handler = arg;
    int rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    handler->arrived(handler->arg, header, header_length, rendezvous ? NULL : data,
                     rendezvous ? 0 : length, rendezvous);
    /* The data was copied (or refused): UCX may release it. */
    return UCS_OK;
}

/* `handler` must stay valid as long as the worker: the caller keeps it for good. */
int gsm_ucx_set_handler(ucp_worker_h worker, struct gsm_handler *handler) {
    ucp_am_handler_param_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                        UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    params.id = GSM_AM_ID;
    params.flags = UCP_AM_FLAG_WHOLE_MSG;
    params.cb = gsm_am_arrived;
    params.arg = handler;
    return ucp_worker_set_am_recv_handler(worker, &params);
}

struct gsm_failure {
    gsm_failed_fn failed;
    void *arg;
};

static void gsm_ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status) {
    struct gsm_failure *failure = arg;
    failure->failed(failure->arg, ep, status);
}

/* `peer_failure`: whether UCX must detect the peer's failure and fail the endpoint's
 * operations (UCX's PEER mode), as a job that recovers lost ranks needs; UCX then uses only
 * transports that can (not its shared memory), and refuses with UCS_ERR_UNREACHABLE if none
 * reaches the peer. Without it a link's TCP connection reports the peer's end. `failure` is
 * called (from progress) with the endpoint if UCX reports it failed; it must stay valid as
 * long as the worker: the caller keeps it for good. */
int gsm_ucx_ep_create(ucp_worker_h worker, const void *address, int peer_failure,
                      struct gsm_failure *failure, ucp_ep_h *ep) {
    ucp_ep_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = (const ucp_address_t *)address;
    params.err_mode = peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = gsm_ep_failed;
    params.err_handler.arg = failure;
    return ucp_ep_create(worker, &params, ep);
}

/* Whether a send that did not complete at once has completed since the thread last asked
 * (gsm_ucx_take_sends_completed): UCX's progress may complete one without counting it as
 * progress, and its writer must still learn it. Per thread: a worker is one thread's. */
static __thread int gsm_sends_completed;

static void gsm_send_done(void *request, ucs_status_t status, void *user_data) {
    (void)request;
    (void)status;
    (void)user_data;
    gsm_sends_completed = 1;
}

int gsm_ucx_take_sends_completed(void) {
    int completed = gsm_sends_completed;
    gsm_sends_completed = 0;
    return completed;
}

/* Sends one message; `*request` is NULL if it completed at once, else a request to poll with
 * gsm_ucx_request_status and free with gsm_ucx_request_free (its completion, from progress,
 * is also noted for gsm_ucx_take_sends_completed). The data must stay unchanged until then.
 * Eager only: a receiver never has to fetch a message. */
int gsm_ucx_send(ucp_ep_h ep, const void *header, size_t header_length, const void *data,
                 size_t length, void **request) {
    ucp_request_param_t params;
    memset(&params, 0, sizeof(params));
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK;
    params.flags = UCP_AM_SEND_FLAG_EAGER;
    params.cb.send = gsm_send_done;
    ucs_status_ptr_t sent = ucp_am_send_nbx(ep, GSM_AM_ID, header, header_length, data, length,
                                            &params);
    *request = NULL;
    if (UCS_PTR_IS_ERR(sent)) {
        return UCS_PTR_STATUS(sent);
    }
    *request = sent;
    return UCS_OK;
}

/* UCS_INPROGRESS while the request runs, then its result. */
int gsm_ucx_request_status(void *request) {
    return ucp_request_check_status(request);
}

void gsm_ucx_request_free(void *request) {
    ucp_request_free(request);
}

/* ---- One-sided access to a node's region heap (rma.rs). ---- */

/* Registers `length` bytes at `address` (the node's region heap) for remote access, or with
 * `address` NULL allocates them (then `*address` and `*length` say where and how many), and
 * packs the key peers reach them with: `*packed` (of `*packed_length` bytes) is released with
 * gsm_ucx_rkey_release once copied. The registration is kept for good. */
int gsm_ucx_mem_map(ucp_context_h context, void **address, size_t *length, void **packed,
                    size_t *packed_length) {
    ucp_mem_map_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = *address;
    params.length = *length;
    if (*address == NULL) {
        params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        params.flags = UCP_MEM_MAP_ALLOCATE;
    }
    ucp_mem_h memh;
    ucs_status_t status = ucp_mem_map(context, &params, &memh);
    if (status != UCS_OK) {
        return status;
    }
    ucp_mem_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    status = ucp_mem_query(memh, &attr);
    if (status != UCS_OK) {
        return status;
    }
    *address = attr.address;
    *length = attr.length;
    return ucp_rkey_pack(context, memh, packed, packed_length);
}

void gsm_ucx_rkey_release(void *packed) {
    ucp_rkey_buffer_release(packed);
}

/* Unpacks a peer's key on the endpoint to it; kept as long as the endpoint (for good). */
int gsm_ucx_rkey_unpack(ucp_ep_h ep, const void *packed, ucp_rkey_h *rkey) {
    return ucp_ep_rkey_unpack(ep, packed, rkey);
}

/* A pointer this process can load and store the peer's `remote` address through, where UCX
 * maps the peer's memory (its shared memory); else an error. */
int gsm_ucx_rkey_ptr(ucp_rkey_h rkey, uint64_t remote, void **local) {
    return ucp_rkey_ptr(rkey, remote, local);
}

/* What UCX calls when a one-sided operation that did not complete at once completes:
 * (arg, status), from ucp_worker_progress. */
typedef void (*gsm_done_fn)(void *arg, int status);

struct gsm_done {
    gsm_done_fn done;
    void *arg;
};

static void gsm_rma_done(void *request, ucs_status_t status, void *user_data) {
    struct gsm_done *done = user_data;
    ucp_request_free(request);
    done->done(done->arg, status);
}

/* The parameters of every one-sided operation: `done` is called on a later completion (and
 * must stay valid until then); 8-byte elements for atomics. */
static ucp_request_param_t gsm_rma_params(struct gsm_done *done, uint64_t *reply) {
    ucp_request_param_t params;
    memset(&params, 0, sizeof(params));
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.send = gsm_rma_done;
    params.user_data = done;
    if (reply != NULL) {
        params.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        params.datatype = ucp_dt_make_contig(8);
        params.reply_buffer = reply;
    }
    return params;
}

/* What an operation's start returns: 0, it completed (`done` will not be called); 1, it is
 * under way (`done` will be called once, from progress); negative, it failed to start. */
static int gsm_rma_started(ucs_status_ptr_t started) {
    if (started == NULL) {
        return 0;
    }
    if (UCS_PTR_IS_ERR(started)) {
        return UCS_PTR_STATUS(started);
    }
    return 1;
}

int gsm_ucx_put(ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote,
                ucp_rkey_h rkey, struct gsm_done *done) {
    ucp_request_param_t params = gsm_rma_params(done, NULL);
    return gsm_rma_started(ucp_put_nbx(ep, buffer, length, remote, rkey, &params));
}

int gsm_ucx_get(ucp_ep_h ep, void *buffer, size_t length, uint64_t remote, ucp_rkey_h rkey,
                struct gsm_done *done) {
    ucp_request_param_t params = gsm_rma_params(done, NULL);
    return gsm_rma_started(ucp_get_nbx(ep, buffer, length, remote, rkey, &params));
}

/* An atomic on the peer's word at `remote`: fetch-and-add of `*operand` (`compare_swap` 0), or
 * (`compare_swap` 1) a store of `*reply` (on entry, the new value) if the word holds
 * `*operand`. Either way `*reply` receives the word's value before. */
int gsm_ucx_atomic(ucp_ep_h ep, int compare_swap, const uint64_t *operand, uint64_t *reply,
                   uint64_t remote, ucp_rkey_h rkey, struct gsm_done *done) {
    ucp_request_param_t params = gsm_rma_params(done, reply);
    ucp_atomic_op_t op = compare_swap ? UCP_ATOMIC_OP_CSWAP : UCP_ATOMIC_OP_ADD;
    return gsm_rma_started(ucp_atomic_op_nbx(ep, op, operand, 1, remote, rkey, &params));
}

/* Orders this worker's operations issued before it before those issued after it. */
int gsm_ucx_worker_fence(ucp_worker_h worker) {
    return ucp_worker_fence(worker);
}

/* Completes once every operation issued on the endpoint before it has completed at its
 * target. Returns as gsm_ucx_put. */
int gsm_ucx_ep_flush(ucp_ep_h ep, struct gsm_done *done) {
    ucp_request_param_t params = gsm_rma_params(done, NULL);
    return gsm_rma_started(ucp_ep_flush_nbx(ep, &params));
}
