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
    ucp_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
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

/* Endpoints are made without UCX's peer-failure handling: its shared-memory transports
 * cannot provide it (1.13), and asking for it would route same-host peers over TCP. A link's
 * TCP connection reports the peer's end instead. `failure` is still called (from progress)
 * with the endpoint if UCX reports one failed; it must stay valid as long as the worker: the
 * caller keeps it for good. */
int gsm_ucx_ep_create(ucp_worker_h worker, const void *address, struct gsm_failure *failure,
                      ucp_ep_h *ep) {
    ucp_ep_params_t params;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = (const ucp_address_t *)address;
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = gsm_ep_failed;
    params.err_handler.arg = failure;
    return ucp_ep_create(worker, &params, ep);
}

/* Sends one message; `*request` is NULL if it completed at once, else a request to poll with
 * gsm_ucx_request_status and free with gsm_ucx_request_free. The data must stay unchanged
 * until then. Eager only: a receiver never has to fetch a message. */
int gsm_ucx_send(ucp_ep_h ep, const void *header, size_t header_length, const void *data,
                 size_t length, void **request) {
    ucp_request_param_t params;
    memset(&params, 0, sizeof(params));
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_AM_SEND_FLAG_EAGER;
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
