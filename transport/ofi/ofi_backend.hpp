// libfabric backend (RDM endpoints): the design, and where each part lives.
//
// RDM endpoints are connectionless, so connections are built on top of them:
//  * ofi_fabric: the provider LibfabricSettings names (preferring one with RMA reads,
//    FI_HMEM for cuda bodies), its fabric and domain, and what it grants.
//  * ofi_endpoint: an endpoint with its address vector and completion queue, the
//    operations posted on it and the progress that completes them: the provider's
//    data progress is manual, so each endpoint has a progress thread (busy only
//    while its sends are in flight, else it naps 1 ms), and every waiting call polls
//    the completion queue itself. The domain is FI_THREAD_SAFE and completions are
//    routed to their operation by context, whichever thread reaps them.
//  * ofi_wire: every message is tagged | kind:4 | connection id:20 | sequence:24 |
//    segment:16 |, so many connections share the listener's endpoint and many
//    messages can be in flight; a receive always names the exact message it wants
//    (no reliance on the provider's ordering between tags). A message is a header
//    message (16-byte prefix carrying the header and body sizes, then the header)
//    and, when the body is not empty, the body as one or more tagged segments (each
//    at most the provider's max_msg_size, capped at 1 GiB), received straight into
//    the caller's registered buffer.
//  * ofi_handshake, ofi_listener: a Listener owns one RDM endpoint bound to
//    host:port and keeps a few "hello" receives posted; a client opens an endpoint
//    (or, where reads are staged and receives can name their source, shares the one
//    its backend holds for that local address: ofi_rxm's buffer pools cost about
//    100 MB an endpoint; its receives then name the peer, since two listeners may
//    assign the same connection id), inserts the listener's address into its address
//    vector and sends a hello carrying its own address (fi_getname) and a nonce; the
//    listener's accept() inserts that address, assigns the connection an id and
//    answers with a hello-ack (tagged with the nonce) carrying the id. A deadline or
//    cancel that ends accept() after it took a hello but before the ack completed
//    leaves that handshake pending: the next accept() finishes it first.
//  * ofi_connection, ofi_send, ofi_receive: sends are zero copy: post_send copies
//    only the header (injected when small) and posts the body segments straight
//    from the caller's registered memory; what the provider's queue cannot take yet
//    waits in a per-connection backlog, flushed by the connection's later send
//    calls and by its receive calls while they wait (so a thread that posts and then
//    waits for the answer does not stall its own message). wait_sends polls until
//    the messages' operations complete (for a rendezvous body: once the peer has
//    received it); on timeout, cancel or error it breaks the connection, cancels and
//    drains (200 ms) what is outstanding. tcp;ofi_rxm and shm do not cancel sends: a
//    rendezvous send the peer never matched stays posted (logged as an error), so
//    that guarantee holds only as far as the provider allows. send() is post_send +
//    wait_sends, so a large blocking send needs a peer that reads. An orderly
//    Connection destruction sends "bye" with the number of messages sent; a receiver
//    that has consumed all of them gets StatusCode::unavailable at once.
//    On ofi_rxm a body larger than the inject size is held until the receiver says
//    "clear" (MsgType::clear, tagged with the message's sequence; the header's
//    kWaitsForClear says so), which it sends once the body's receives are posted,
//    and every receive first discards queued messages it should not take (larger
//    than it takes; for a body on its clear, any). ofi_rxm 1.17 keeps a large message
//    queued after its sender's connection closed, and a receive that matched it then
//    crashed the process: a peer that sent a header and a large body and hung up (or
//    died) before the body was read brought the node down. A body now meets a posted
//    receive, while its sender's connection is open (Core::cleared_bodies). Each
//    connection keeps one receive for its peer's clears posted; a clear's callback
//    sends the body from whichever thread reaps it. A receive posted ahead
//    (post_recv) sends its clear at once, so a body that waits for it leaves as soon
//    as it is sent: the round trip a clear costs is hidden where receivers post
//    ahead. The hello's magic changed with this (kHelloMagic): clients and nodes of
//    the version before are refused.
//  * ofi_rma: registrations and one-sided reads (where the provider grants FI_RMA and
//    FI_READ: tcp;ofi_rxm and shm here, verbs/efa elsewhere): MemoryRegion::expose
//    packs fi_mr_key and the domain's addressing mode (virtual address or offset);
//    Connection::read posts fi_read segments straight into the caller's registered
//    buffer (on ofi_rxm into a staging buffer, copied out: Core::staged_reads).
//    libfabric cannot cancel an RMA read, so an interrupted direct one is given
//    20 ms to finish and then a client's own endpoint is closed under it: nothing
//    lands in the caller's buffer after read returns. A shared endpoint (a
//    listener's, or a client endpoint shared where reads are staged) is never closed
//    so; an accepted connection can only log that case.
//  * ofi_backend: the factory, the capabilities, connect and register_memory.
#pragma once

#include "transport/backends.hpp"
