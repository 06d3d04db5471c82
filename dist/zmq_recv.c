/* zmq_msg_recv with signals retried (dist_impl.h says why). */
#include "dist_impl.h"

#include <errno.h>
#include <zmq.h>

int ct__dist_zmq_recv(struct zmq_msg_t *m, void *sock, int flags) {
    int rc;
    while ((rc = zmq_msg_recv(m, sock, flags)) < 0 && zmq_errno() == EINTR)
        ;
    return rc;
}
