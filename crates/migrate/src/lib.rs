//! Session migration (CSSL-SF, the CSSL paper, section 4.4.1): how a TLS connection that one agent
//! (the *handshake agent*) has just finished the handshake for is switched, on the same client
//! TCP stream, to another agent (the client's *home agent*), which carries the bulk traffic.
//!
//! Every client connection reaches an agent as one stream of the *agent link* (`baton-link`:
//! a few long-lived connections between the dispatcher and each agent, authenticated both ways
//! with the cluster key, multiplexed). A migration is a stream move: the dispatcher opens a
//! stream on the home agent's link, not a TCP connection. Migration frames are read on link
//! streams only, never on an agent's public port.
//!
//! After ServerHello everything is an encrypted record of type 23, so the dispatcher cannot see
//! where the handshake ends: the handshake agent tells it, in-band, with *migration frames*. A
//! frame looks like a record header with a content type TLS never uses (0xBA), the magic "BT"
//! and a 16-bit length, so one splitter walks a stream that mixes records and frames. Frames
//! travel only between Baton processes; the client never sees one, and one that comes from the
//! client is an error.
//!
//! The exchange (dispatcher D, handshake agent A, home agent H, client C) is a two-phase
//! commit: at every moment at most one agent may use the session's keys.
//!
//! ```text
//!  D->A  Offer{home, binding}  before the ClientHello: "hand this connection to agent `home`";
//!                              `binding` = the id of the H link D will use || a fresh token
//!                              (no Offer when A is the home agent already: a plain splice)
//!  ...   the handshake, relayed both ways; D tracks C's record boundaries and keeps a copy
//!        of every client byte it forwards to A from the Offer on (at most MAX_HELD: past it
//!        D stops reading C until A has cut)
//!  A     its handshake is done: it decrypts every whole client record rustls has read (at
//!        most MAX_CARRIED plaintext: past it A sends Abort and keeps the connection), and
//!        cuts there: `cut` = how many client bytes after the Offer it consumed, a record
//!        boundary (part of a record rustls read past it is not consumed: its sequence number
//!        stays unused, and rustls drops it at extraction); A extracts the session and seals
//!        it bound to `binding`
//!  A->D  tickets + Switch{cut, session}   in one write
//!        (or Decline / Abort: A keeps the connection; D splices A<->C from here on);
//!        D's shell holds the tickets for C until the verdict and sends them with the first
//!        bytes of whichever agent serves on (at most a few ms later): one write to C
//!  D     forwards to A the rest of the client record it is in the middle of (a frame can
//!        follow only a record boundary), then holds C's bytes: the held bytes start at `cut`
//!        in the copy. A discards every client record after its cut until the verdict.
//!  D->H  Import{session}    the first bytes of a new stream on that H link, carrying the token
//!  H->D  Ready              H opened the object (bound to this link and token, unexpired,
//!                           never imported, issued after H started); H uses nothing yet
//!        (or Refused{reason})
//!  D->H  Commit             D's decision, once: then the held bytes, and H<->C is spliced;
//!  D->A  Done               A drops the keys and closes its stream (on the agent link, D
//!                           sends Done as the stream's release, a reset with NO_ERROR: one
//!                           frame, and A owes no END_STREAM back)
//!        Refused, a broken H stream, or D's timeout before Ready:
//!  D->H  Abort              (and the H stream is reset): H drops the keys, sends nothing
//!  D->A  Resume             then the held bytes: A serves the session from its own record layer
//!  (A->D Kept{cut}          A cut and extracted but could not seal: D answers Resume and the
//!                           held bytes from `cut` at once, as after a refusal)
//! ```
//!
//! A draining agent moves an established connection the same way, with the dispatcher's
//! answer as the cut: A sends Leave (nothing more to the client from there) and decrypts the
//! client's records until D's Offer; D sends the Offer at a client record boundary (forwarding
//! the rest of the record it is in first) and holds every client byte after it; A switches with
//! `cut` = 0 (or Abort: D gives it the held bytes and it keeps the connection). D answers
//! Stay instead when there is nowhere to go.
//!
//! Why this keeps the invariants: client bytes go to exactly one agent, cut only at a record
//! boundary, so no record is split between two decryptors and none is lost or repeated: A
//! decrypted exactly the records before `cut` (D checks that `cut` is a record boundary within
//! what it forwarded), and H gets exactly the copy from `cut` on, in order, before anything
//! later. A decrypts nothing after its cut (it discards those records; on Resume it gets them
//! again, from the copy). H has the session before the first record it must decrypt. Nobody
//! encrypts twice under a key and sequence number: A sends nothing after Switch until D's
//! verdict, H nothing after Ready until Commit, and D sends exactly one of Commit (to H) and
//! Resume (to A). A timeout never grants the keys: A waiting for a verdict and H waiting for
//! Commit give up by closing, never by using them. A sealed object copied off a link opens only
//! on that link, with that token, once. The copy cannot deadlock the cut: A cuts as soon as
//! its handshake is done, and the client's bytes up to its Finished (a hello and at most a
//! certificate flight) are far below MAX_HELD, so D never stops reading the client before A
//! can cut; after Switch D reads on to the end of the current record whatever the copy holds
//! (one record more, at most).
//!
//! The link's handshake carries the protocol version (`baton_link::auth::VERSION`): a dispatcher
//! and agents of builds that speak different exchanges refuse each other's links rather than
//! mis-parse these frames (the frame kinds of the retired Freeze/Frozen exchange are not
//! reused either).
//!
//! Sans-IO, like the rest of the crate: no sockets, no tokio. The parts:
//!
//! - [`frame`]: the frames and the splitter that walks a stream mixing records and frames.
//! - [`relay`]: the dispatcher's side as a state machine ([`Relay`]): bytes in, [`Action`]s out,
//!   its deadlines kept on the caller's clock; [`move_driver`]: one move around it
//!   ([`MoveDriver`]), what the dispatcher's shell and the agent's harness both run.
//! - [`export`] and [`import`]: the handshake and home agents' frames as state machines
//!   ([`Exporter`], [`Importer`]). Every deadline of the three comes from one setting
//!   ([`timeouts`]) and is kept by the machine itself on the caller's clock (virtual time in
//!   tests).
//! - [`export_driver`] and [`import_driver`]: each agent's whole side of a migration around
//!   those machines ([`ExportDriver`], [`ImportDriver`]): bytes and time in, bytes to write and
//!   steps to do out, the TLS work asked of the caller. The agents' tokio shells and the
//!   agent's in-memory harness run these same drivers.
//! - [`extract`]: the handshake agent's TLS work: decrypting up to the cut and turning a
//!   finished rustls connection into a session object; [`secrets`]: TLS 1.3 traffic secrets
//!   captured for KeyUpdate after the move; [`suite`]: the record layer that carries a
//!   session object on.
//! - [`restart`]: the messages by which a dispatcher hot-restarts, handing its successor the
//!   connections it serves and where each relay stands.
//! - [`fuzzing`]: the entry points of the fuzz targets.

#![forbid(unsafe_code)]

pub mod export;
pub mod export_driver;
pub mod extract;
pub mod frame;
pub mod fuzzing;
pub mod import;
pub mod import_driver;
pub mod move_driver;
pub mod relay;
pub mod restart;
pub mod secrets;
pub mod suite;
pub mod timeouts;

pub use export::{ExportEvent, ExportInput, Exporter};
pub use export_driver::{ExportDriver, ExportFailure, ExportStep, Extraction, Offered};
pub use frame::{
    Frame, MigrationError, Passed, RefuseReason, Split, Splitter, BINDING_LEN, FRAME_MAGIC,
    FRAME_TYPE, IMPORT_KIND, MAX_FRAME_BODY, MAX_HELD,
};
pub use import::{ImportEvent, Importer};
pub use import_driver::{ImportDriver, ImportFailure, ImportStep};
pub use move_driver::{MoveDriver, MoveIo};
pub use relay::{Action, Expired, MoveReason, Outcome, Position, Relay, Target};
pub use secrets::{SecretLog, TrafficSecrets};
pub use suite::{record_layer, record_suite};
pub use timeouts::Timeouts;

#[cfg(test)]
mod agent_test;
#[cfg(test)]
mod driver_test;
#[cfg(test)]
mod leave_test;
#[cfg(test)]
mod relay_test;
