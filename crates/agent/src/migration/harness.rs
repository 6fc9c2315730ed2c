//! An in-memory harness for session migration, after quinn-proto's tests: a rustls client and
//! the three actors of a migration, wired by in-memory pipes on virtual time. Nothing opens a
//! socket or sleeps: a migration with a fault in it runs in a millisecond or two, so a property
//! test can try thousands of schedules.
//!
//! The actors run the shipped drivers, not copies of them: the dispatcher pumps
//! `baton_migrate::MoveDriver` as `crates/dispatch/src/migration.rs` does, the handshake agent
//! `ExportDriver` as [`super::export`] does (with rustls and the same extraction functions),
//! the home agent `ImportDriver` as [`super::import`] does (the session object, the record
//! layer). What is left here is the plumbing a shell does: the pipes, the clock, the TLS
//! engines, and the faults of a process (dead, stopped, late, crashed). Each actor keeps its
//! own deadlines from one `Timeouts`, split between them as they ship. Like the shells, the
//! handshake agent lets rustls read the link stream in reads of up to 4 KiB while the handshake
//! runs (tokio-rustls does), so the first bytes after the handshake may fall in the middle of
//! a record. Not modelled: flow control (the data is small) and the link's h2 framing: a link
//! stream is a FIFO pipe, and its END, reset and release are messages in it.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use baton_migrate::{
    ExportDriver, ExportStep, Extraction, Frame, ImportDriver, ImportStep, MoveDriver, MoveIo,
    Offered, Outcome, RefuseReason, Relay, Splitter, Target, Timeouts, BINDING_LEN,
};
use baton_record::RecordLayer;
use baton_session::migration::{ReplayGuard, SessionObject, MAX_CARRIED_PLAINTEXT};
use baton_session::{KeyRing, TicketKey};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};

use crate::conn_info::ConnInfo;
use baton_migrate::extract::{self, Extras};
use baton_migrate::secrets::{self, Expected, SecretLog};

/// The agents' ids: A runs the handshake, H is the client's home agent.
const AGENT_A: u16 = 1;
const AGENT_H: u16 = 2;

/// What goes wrong, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// The dispatcher has no link to the home agent: the stream cannot be opened.
    HomeDead,
    /// The home agent reads nothing for this long from the moment the import stream opens
    /// (SIGSTOP, then SIGCONT); `None`: never again.
    HomeHung(Option<Duration>),
    /// The home agent has another cluster key: the object does not open.
    HomeWrongKey,
    /// The home agent restarted after the object was sealed.
    HomeRestarted,
    /// The home agent opens the object but answers Ready only this long after.
    HomeLate(Duration),
    /// The home agent's process dies right after it sends Ready.
    HomeCrashAfterReady,
    /// The handshake agent's process dies right after it sends Switch.
    AgentCrashAfterSwitch,
    /// The handshake agent extracts but cannot seal the object (Kept): it serves the session
    /// itself, from its cut.
    SealFails,
}

impl Fault {
    /// Whether the fault may cost the client its connection (a process that held it died).
    pub fn may_lose_connection(self) -> bool {
        matches!(
            self,
            Fault::HomeCrashAfterReady | Fault::AgentCrashAfterSwitch
        )
    }
}

/// What the client does once its handshake is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientStep {
    /// Send this many bytes of application data.
    Send(usize),
    /// Send a KeyUpdate asking for one back (TLS 1.3; nothing in TLS 1.2).
    KeyUpdate,
}

/// One run's script.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub tls13: bool,
    pub fault: Fault,
    /// The client's steps after its handshake, each after a pause (zero: in the same flight).
    pub client: Vec<(Duration, ClientStep)>,
    /// One-way delays of the messages, used in turn; every pipe stays FIFO.
    pub delays: Vec<Duration>,
    /// `--migration-timeout`: every actor's deadlines, split between them as they ship.
    pub timeouts: Timeouts,
    /// The client plaintext a session object may carry (`MAX_CARRIED_PLAINTEXT`).
    pub cap: usize,
}

impl Schedule {
    pub fn new(tls13: bool, fault: Fault, client: Vec<(Duration, ClientStep)>) -> Self {
        Self {
            tls13,
            fault,
            client,
            delays: vec![Duration::from_micros(100)],
            timeouts: Timeouts::new(Duration::from_millis(50)),
            cap: MAX_CARRIED_PLAINTEXT,
        }
    }
}

/// What happened.
#[derive(Debug, Default)]
pub struct Report {
    pub outcome: Option<Outcome>,
    /// Application data the client sent and got back (the agents echo it).
    pub sent: Vec<u8>,
    pub received: Vec<u8>,
    /// A TLS error the client saw (a bad record, an alert): never expected.
    pub client_error: Option<String>,
    /// The client's connection was closed under it.
    pub client_closed: bool,
    /// Application data each agent acted on (echoed), in order.
    pub executed_a: Vec<u8>,
    pub executed_h: Vec<u8>,
    /// Whether a session object was extracted from the handshake agent's rustls.
    pub extracted: bool,
    /// Whether rustls had read part of a record past the handshake agent's cut.
    pub partial_at_cut: bool,
    /// Client bytes after its cut that reached the handshake agent before the verdict (it
    /// discards them).
    pub after_cut_a: usize,
    /// Records each agent sent from the extracted session state (the record layer): both
    /// start at the extracted key and sequence number, so both non-zero means a nonce reused.
    pub layer_records_a: usize,
    pub layer_records_h: usize,
    /// Protocol errors, by actor, for the record.
    pub errors: Vec<String>,
    /// Virtual time from the client's first byte to quiescence, and events run.
    pub elapsed: Duration,
    pub events: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pipe {
    ClientToDisp,
    DispToClient,
    DispToA,
    AToDisp,
    DispToHome,
    HomeToDisp,
}

#[derive(Debug)]
enum Msg {
    Data(Vec<u8>),
    /// A clean end (TCP FIN, h2 END_STREAM).
    Eof,
    /// The stream was reset (or its connection died).
    Reset,
    /// The dispatcher's release of the handshake agent's stream: Done (`LinkStream::release`).
    Release,
}

#[derive(Debug, Clone, Copy)]
enum Who {
    Client,
    Disp,
    A,
    Home,
}

#[derive(Debug)]
enum Event {
    Deliver(Pipe, Msg),
    Timer(Who),
}

/// The pipes and the clock.
struct Net {
    now: Instant,
    queue: BTreeMap<(Instant, u64), Event>,
    seq: u64,
    delays: Vec<Duration>,
    next_delay: usize,
    last: BTreeMap<Pipe, Instant>,
    /// Pipes whose sender has ended them.
    ended: Vec<Pipe>,
}

impl Net {
    fn push(&mut self, at: Instant, e: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), e);
    }

    fn send(&mut self, p: Pipe, m: Msg) {
        if self.ended.contains(&p) {
            return;
        }
        if !matches!(m, Msg::Data(_)) {
            self.ended.push(p);
        }
        if matches!(&m, Msg::Data(d) if d.is_empty()) {
            return;
        }
        let d = self.delays[self.next_delay % self.delays.len()];
        self.next_delay += 1;
        let at = (self.now + d).max(self.last.get(&p).copied().unwrap_or(self.now));
        self.last.insert(p, at);
        self.push(at, Event::Deliver(p, m));
    }

    fn timer(&mut self, at: Instant, who: Who) {
        self.push(at.max(self.now), Event::Timer(who));
    }
}

/// Runs a schedule to quiescence (every actor idle, no message or timer left).
pub fn run(s: &Schedule) -> Report {
    let t0 = Instant::now();
    let mut net = Net {
        now: t0,
        queue: BTreeMap::new(),
        seq: 0,
        delays: if s.delays.is_empty() {
            vec![Duration::ZERO]
        } else {
            s.delays.clone()
        },
        next_delay: 0,
        last: BTreeMap::new(),
        ended: Vec::new(),
    };
    let mut report = Report::default();
    let mut client = Client::new(s);
    let mut disp = Disp::new(s);
    let mut a = HandshakeAgent::new(s);
    let mut home = HomeAgent::new(s);
    client.start(&mut net);
    while let Some(((at, _), event)) = net.queue.pop_first() {
        net.now = at;
        report.events += 1;
        assert!(report.events < 200_000, "no quiescence after 200k events");
        assert!(
            at - t0 < Duration::from_secs(600),
            "virtual time ran past 600 s"
        );
        match event {
            Event::Deliver(Pipe::DispToClient, m) => client.input(&mut net, m),
            Event::Deliver(Pipe::ClientToDisp, m) => disp.on_client(&mut net, m),
            Event::Deliver(Pipe::AToDisp, m) => disp.on_agent(&mut net, m),
            Event::Deliver(Pipe::HomeToDisp, m) => disp.on_home(&mut net, m),
            Event::Deliver(Pipe::DispToA, m) => a.input(&mut net, m),
            Event::Deliver(Pipe::DispToHome, m) => home.input(&mut net, m),
            Event::Timer(Who::Client) => client.steps_due(&mut net),
            Event::Timer(Who::Disp) => disp.timer(&mut net),
            Event::Timer(Who::A) => a.timer(&mut net),
            Event::Timer(Who::Home) => home.timer(&mut net),
        }
        report.elapsed = at - t0;
    }
    report.outcome = disp.driver.as_ref().and_then(|d| d.relay().outcome());
    report.sent = client.sent;
    report.received = client.received;
    report.client_error = client.error;
    report.client_closed = client.closed;
    report.executed_a = a.served.executed;
    report.executed_h = home.served.executed;
    report.extracted = a.extracted;
    report.partial_at_cut = a.partial_at_cut;
    report.after_cut_a = a.after_cut;
    report.layer_records_a = a.served.layer_records;
    report.layer_records_h = home.served.layer_records;
    report.errors = [disp.errors, a.served.errors, home.served.errors].concat();
    report
}

// --- certificates and configs -------------------------------------------------------------

struct Pki {
    chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("name");
        let cert = params.self_signed(&key).expect("certificate");
        Pki {
            chain: vec![cert.der().clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        }
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

pub(super) fn server_config(log: Arc<SecretLog>) -> Arc<ServerConfig> {
    let pki = pki();
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(pki.chain.clone(), PrivateKeyDer::Pkcs8(pki.key.clone_key()))
        .expect("server config");
    cfg.enable_secret_extraction = true;
    cfg.key_log = log;
    Arc::new(cfg)
}

pub(super) fn client_config(tls13: bool) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki().chain[0].clone()).expect("root");
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13 {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS12]
    };
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

pub(super) fn cluster_ring(secret: u8) -> KeyRing {
    KeyRing::new(vec![TicketKey::new(7, &[secret; 32], Instant::now())])
}

/// The client's application data: position-dependent, so a byte out of place shows.
pub(super) fn pattern(from: usize, n: usize) -> Vec<u8> {
    (from..from + n).map(|i| (i % 251) as u8).collect()
}

/// Whole TLS records in `bytes` (the record layer emits only whole records).
fn records(mut bytes: &[u8]) -> usize {
    let mut n = 0;
    while bytes.len() >= 5 {
        let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
        bytes = &bytes[(5 + len).min(bytes.len())..];
        n += 1;
    }
    n
}

/// rustls' pending output, all of it.
fn drain_tls(conn: &mut rustls::ConnectionCommon<impl rustls::SideData>) -> Vec<u8> {
    let mut out = Vec::new();
    while conn.wants_write() {
        if conn.write_tls(&mut out).is_err() {
            break;
        }
    }
    out
}

// --- the client ----------------------------------------------------------------------------

struct Client {
    conn: ClientConnection,
    steps: VecDeque<(Duration, ClientStep)>,
    next_step_at: Option<Instant>,
    handshaking: bool,
    sent: Vec<u8>,
    received: Vec<u8>,
    error: Option<String>,
    closed: bool,
}

impl Client {
    fn new(s: &Schedule) -> Self {
        let name = ServerName::try_from("localhost").expect("name");
        Self {
            conn: ClientConnection::new(client_config(s.tls13), name).expect("client"),
            steps: s.client.iter().copied().collect(),
            next_step_at: None,
            handshaking: true,
            sent: Vec::new(),
            received: Vec::new(),
            error: None,
            closed: false,
        }
    }

    fn start(&mut self, net: &mut Net) {
        self.flush(net);
    }

    fn flush(&mut self, net: &mut Net) {
        let out = drain_tls(&mut self.conn);
        net.send(Pipe::ClientToDisp, Msg::Data(out));
    }

    fn input(&mut self, net: &mut Net, m: Msg) {
        let Msg::Data(data) = m else {
            self.closed = true;
            return;
        };
        if self.error.is_some() {
            return;
        }
        let mut rest = &data[..];
        while !rest.is_empty() {
            if self.conn.read_tls(&mut rest).is_err() {
                self.error = Some("read_tls".into());
                return;
            }
            if let Err(e) = self.conn.process_new_packets() {
                self.error = Some(e.to_string());
                self.flush(net);
                return;
            }
            let mut buf = [0u8; 8192];
            while let Ok(n) = self.conn.reader().read(&mut buf) {
                if n == 0 {
                    break;
                }
                self.received.extend_from_slice(&buf[..n]);
            }
        }
        if self.handshaking && !self.conn.is_handshaking() {
            self.handshaking = false;
            if let Some((pause, _)) = self.steps.front() {
                self.next_step_at = Some(net.now + *pause);
            }
            // a step due at once goes out with the client's last handshake flight
            self.run_steps(net);
        }
        self.flush(net);
    }

    fn steps_due(&mut self, net: &mut Net) {
        self.run_steps(net);
        self.flush(net);
    }

    fn run_steps(&mut self, net: &mut Net) {
        while let Some(at) = self.next_step_at {
            if at > net.now {
                net.timer(at, Who::Client);
                return;
            }
            if self.closed || self.error.is_some() {
                return;
            }
            let Some((_, step)) = self.steps.pop_front() else {
                self.next_step_at = None;
                return;
            };
            match step {
                ClientStep::Send(n) => {
                    let data = pattern(self.sent.len(), n);
                    self.conn.writer().write_all(&data).expect("buffered");
                    self.sent.extend_from_slice(&data);
                }
                ClientStep::KeyUpdate => {
                    // TLS 1.2 has none: rustls refuses, and nothing is sent
                    let _ = self.conn.refresh_traffic_keys();
                }
            }
            self.next_step_at = self.steps.front().map(|(pause, _)| net.now + *pause);
        }
    }
}

// --- the dispatcher ------------------------------------------------------------------------

/// The dispatcher's shell (`crates/dispatch/src/migration.rs`): the shipped `MoveDriver`
/// pumped as `moving` pumps it, then the splice.
struct Disp {
    /// The move, once the client's first bytes came (with the Offer, to the agent).
    driver: Option<MoveDriver>,
    timeouts: Timeouts,
    fault: Fault,
    home_open: bool,
    spliced: Option<Target>,
    ended: bool,
    errors: Vec<String>,
}

/// The binding the dispatcher puts in its Offer: the home link's id and a fresh token.
fn binding() -> [u8; BINDING_LEN] {
    let mut b = [0u8; BINDING_LEN];
    b[..16].copy_from_slice(&[0x11; 16]);
    b[16..].copy_from_slice(&[0x22; 16]);
    b
}

impl Disp {
    fn new(s: &Schedule) -> Self {
        Self {
            driver: None,
            timeouts: s.timeouts,
            fault: s.fault,
            home_open: false,
            spliced: None,
            ended: false,
            errors: Vec::new(),
        }
    }

    /// The shell returns: every stream and the client socket are dropped.
    fn end(&mut self, net: &mut Net) {
        if self.ended {
            return;
        }
        self.ended = true;
        net.send(Pipe::DispToClient, Msg::Eof);
        net.send(Pipe::DispToA, Msg::Reset);
        if self.home_open {
            net.send(Pipe::DispToHome, Msg::Reset);
        }
    }

    /// Feeds the move under way, then does what it asks.
    fn feed(&mut self, net: &mut Net, f: impl FnOnce(&mut MoveDriver)) {
        if let Some(d) = self.driver.as_mut() {
            f(d);
        }
        self.pump(net);
    }

    fn on_client(&mut self, net: &mut Net, m: Msg) {
        if self.ended {
            return;
        }
        match (m, self.spliced) {
            (Msg::Data(d), Some(Target::HandshakeAgent)) => net.send(Pipe::DispToA, Msg::Data(d)),
            (Msg::Data(d), Some(Target::HomeAgent)) => net.send(Pipe::DispToHome, Msg::Data(d)),
            (Msg::Data(d), None) if self.driver.is_none() => {
                let mut first = Relay::offer(AGENT_H, binding());
                first.extend_from_slice(&d);
                net.send(Pipe::DispToA, Msg::Data(first));
                match MoveDriver::offered(self.timeouts, &d) {
                    Ok(driver) => self.driver = Some(driver),
                    Err(e) => {
                        self.errors.push(format!("dispatcher: {e}"));
                        return self.end(net);
                    }
                }
                self.pump(net);
            }
            (Msg::Data(d), None) => self.feed(net, |x| x.handle_client(&d)),
            (_, Some(Target::HandshakeAgent)) => net.send(Pipe::DispToA, Msg::Eof),
            (_, Some(Target::HomeAgent)) => net.send(Pipe::DispToHome, Msg::Eof),
            (_, None) if self.driver.is_none() => self.end(net),
            (_, None) => self.feed(net, MoveDriver::client_ended),
        }
    }

    fn on_agent(&mut self, net: &mut Net, m: Msg) {
        if self.ended || self.spliced == Some(Target::HomeAgent) {
            return;
        }
        match (m, self.spliced) {
            (Msg::Data(d), Some(_)) => net.send(Pipe::DispToClient, Msg::Data(d)),
            (Msg::Data(d), None) => self.feed(net, |x| x.handle_agent(&d)),
            (Msg::Eof, Some(_)) => net.send(Pipe::DispToClient, Msg::Eof),
            (_, Some(_)) => self.end(net),
            (_, None) => self.feed(net, MoveDriver::agent_ended),
        }
    }

    fn on_home(&mut self, net: &mut Net, m: Msg) {
        if self.ended || !self.home_open {
            return;
        }
        match (m, self.spliced) {
            (Msg::Data(d), Some(_)) => net.send(Pipe::DispToClient, Msg::Data(d)),
            (Msg::Data(d), None) => self.feed(net, |x| x.handle_home(&d)),
            (Msg::Eof, Some(_)) => net.send(Pipe::DispToClient, Msg::Eof),
            (_, Some(_)) => self.end(net),
            (_, None) => {
                self.home_open = false;
                self.feed(net, MoveDriver::home_ended);
            }
        }
    }

    fn timer(&mut self, net: &mut Net) {
        if self.ended || self.spliced.is_some() {
            return;
        }
        let now = net.now;
        self.feed(net, |x| x.handle_timeout(now));
    }

    fn pump(&mut self, net: &mut Net) {
        if self.ended || self.spliced.is_some() {
            return;
        }
        let Some(d) = self.driver.as_mut() else {
            return;
        };
        while let Some(io) = d.poll_io() {
            match io {
                MoveIo::ToClient(b) => net.send(Pipe::DispToClient, Msg::Data(b)),
                MoveIo::ToAgent(b) => net.send(Pipe::DispToA, Msg::Data(b)),
                MoveIo::ToHome(b) => {
                    if self.home_open {
                        net.send(Pipe::DispToHome, Msg::Data(b));
                    }
                }
                MoveIo::OpenHome => {
                    if let Some(deadline) = d.poll_timeout(net.now) {
                        net.timer(deadline, Who::Disp);
                    }
                    let opened = self.fault != Fault::HomeDead;
                    self.home_open = opened;
                    d.home_opened(opened);
                }
                MoveIo::ShutdownAgent => net.send(Pipe::DispToA, Msg::Eof),
                MoveIo::ResetHome => {
                    if std::mem::take(&mut self.home_open) {
                        net.send(Pipe::DispToHome, Msg::Reset);
                    }
                }
                MoveIo::HandshakeOver => {}
                MoveIo::Splice(t) => {
                    self.spliced = Some(t);
                    let client_eof = d.client_ended_held();
                    match t {
                        Target::HomeAgent if !self.home_open => self.end(net),
                        // Done: the handshake agent's stream is released
                        Target::HomeAgent => {
                            net.send(Pipe::DispToA, Msg::Release);
                            if client_eof {
                                net.send(Pipe::DispToHome, Msg::Eof);
                            }
                        }
                        Target::HandshakeAgent => {
                            if client_eof {
                                net.send(Pipe::DispToA, Msg::Eof);
                            }
                        }
                    }
                    return;
                }
                MoveIo::Close => {
                    self.errors
                        .push("dispatcher: the move ended the connection".into());
                    return self.end(net);
                }
                MoveIo::Broken(e) => {
                    self.errors.push(format!("dispatcher: {e}"));
                    return self.end(net);
                }
            }
        }
        if let Some(deadline) = d.poll_timeout(net.now) {
            net.timer(deadline, Who::Disp);
        }
    }
}

// --- the agents ----------------------------------------------------------------------------

/// An agent serving a connection: it echoes what the client sends, and counts what it did.
enum Serving {
    Rustls(Box<ServerConnection>),
    Layer(Box<RecordLayer>),
}

/// What an agent did for the client: what it acted on, the records it sent from an extracted
/// session, and what went wrong.
#[derive(Default)]
struct Served {
    executed: Vec<u8>,
    layer_records: usize,
    errors: Vec<String>,
}

impl Serving {
    /// Acts on `plain` (the request bytes already decrypted), then on `ciphertext`.
    fn serve(&mut self, net: &mut Net, pipe: Pipe, out: &mut Served, plain: &[u8], tls: &[u8]) {
        let mut echo = plain.to_vec();
        out.executed.extend_from_slice(plain);
        match self {
            Serving::Rustls(conn) => {
                let mut rest = tls;
                loop {
                    if !rest.is_empty() && conn.read_tls(&mut rest).is_err() {
                        out.errors.push("agent: read_tls".into());
                        return;
                    }
                    let processed = conn.process_new_packets();
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = conn.reader().read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        out.executed.extend_from_slice(&buf[..n]);
                        echo.extend_from_slice(&buf[..n]);
                    }
                    if let Err(e) = processed {
                        out.errors.push(format!("agent (rustls): {e}"));
                        break;
                    }
                    if rest.is_empty() {
                        break;
                    }
                }
                let _ = conn.writer().write_all(&echo);
                net.send(pipe, Msg::Data(drain_tls(&mut **conn)));
            }
            Serving::Layer(layer) => {
                let mut rest = tls;
                loop {
                    let n = layer.read_tls(rest);
                    rest = &rest[n..];
                    let processed = layer.process();
                    let plain = layer.plaintext().to_vec();
                    layer.consume_plaintext(plain.len());
                    out.executed.extend_from_slice(&plain);
                    echo.extend_from_slice(&plain);
                    if let Err(e) = processed {
                        out.errors.push(format!("agent (record layer): {e}"));
                        break;
                    }
                    if rest.is_empty() || n == 0 && plain.is_empty() {
                        break;
                    }
                }
                let mut echo = &echo[..];
                while !echo.is_empty() {
                    match layer.write_plaintext(echo) {
                        Ok(n) if n > 0 => echo = &echo[n..],
                        _ => break,
                    }
                }
                let pending = layer.pending_tls().to_vec();
                layer.consume_tls(pending.len());
                out.layer_records += records(&pending);
                net.send(pipe, Msg::Data(pending));
            }
        }
    }
}

pub(super) fn conn_info() -> ConnInfo {
    ConnInfo {
        peer: SocketAddr::from(([127, 0, 0, 1], 40000)),
        version: "TLSv1.3",
        suite: String::new(),
        alpn: None,
        sni: None,
        resumed: false,
        client_subject: None,
        early: None,
        log: None,
    }
}

enum AState {
    /// Waiting for the Offer and the ClientHello.
    Hello(Vec<u8>),
    Handshake(Box<ServerConnection>),
    /// The handshake is done: the shipped driver decides, this actor runs the TLS work.
    Exporting(Box<Export>),
    Serving(Serving),
    Closed,
}

/// One export under way: the driver, and the TLS side its steps work on.
struct Export {
    driver: ExportDriver,
    tls: ATls,
    /// Client bytes that came after what the engine read, for whoever serves on if nothing
    /// is taken out (on a socket they would still be unread).
    unread: Vec<u8>,
    /// Switch or Kept sent: what comes now is after the cut.
    switched: bool,
}

enum ATls {
    Engine(Box<ServerConnection>),
    Extracted(Box<SessionObject>),
    Gone,
}

/// The handshake agent: the handshake part of `conn/accept.rs`, then the shipped
/// `ExportDriver` pumped as `export.rs` pumps it.
struct HandshakeAgent {
    state: AState,
    log: Arc<SecretLog>,
    config: Arc<ServerConfig>,
    ring: KeyRing,
    timeouts: Timeouts,
    cap: usize,
    crash_after_switch: bool,
    seal_fails: bool,
    expected: Option<Expected>,
    offer: Option<(u16, [u8; BINDING_LEN])>,
    /// Where the client's records stand in what rustls has read, how many bytes it read, and
    /// where the last whole record among them ends (`ConnIo::record_boundary`).
    read: Splitter,
    followed: usize,
    boundary: usize,
    partial_at_cut: bool,
    after_cut: usize,
    plain: Vec<u8>,
    extracted: bool,
    /// What this agent did for the client.
    served: Served,
}

impl HandshakeAgent {
    fn new(s: &Schedule) -> Self {
        let log = Arc::new(SecretLog::default());
        Self {
            state: AState::Hello(Vec::new()),
            config: server_config(log.clone()),
            log,
            ring: cluster_ring(1),
            timeouts: s.timeouts,
            cap: s.cap,
            crash_after_switch: s.fault == Fault::AgentCrashAfterSwitch,
            seal_fails: s.fault == Fault::SealFails,
            expected: None,
            offer: None,
            read: Splitter::new(),
            followed: 0,
            boundary: 0,
            partial_at_cut: false,
            after_cut: 0,
            plain: Vec::new(),
            extracted: false,
            served: Served::default(),
        }
    }

    fn close(&mut self, net: &mut Net, why: &str) {
        self.served.errors.push(format!("handshake agent: {why}"));
        self.state = AState::Closed;
        net.send(Pipe::AToDisp, Msg::Reset);
    }

    fn input(&mut self, net: &mut Net, m: Msg) {
        let data = match m {
            Msg::Data(d) => d,
            Msg::Eof if matches!(self.state, AState::Serving(_)) => return,
            // The dispatcher's release is Done (`read_until` in export.rs), wherever the
            // stream stood.
            Msg::Release | Msg::Eof | Msg::Reset => {
                match std::mem::replace(&mut self.state, AState::Closed) {
                    AState::Exporting(mut x) => {
                        match m {
                            Msg::Release => x.driver.released(),
                            _ => x.driver.closed(),
                        }
                        self.pump(net, x);
                    }
                    AState::Serving(_) | AState::Closed => {}
                    _ => self.close(net, "stream ended mid-migration"),
                }
                return;
            }
        };
        match std::mem::replace(&mut self.state, AState::Closed) {
            AState::Hello(mut head) => {
                head.extend_from_slice(&data);
                self.hello(net, head);
            }
            AState::Handshake(conn) => self.handshake(net, conn, &data),
            AState::Exporting(mut x) => {
                if x.driver.poll_timeout().is_some() {
                    x.driver.handle(net.now, &data);
                    if x.switched && !x.driver.is_finished() {
                        self.after_cut += data.len();
                    }
                } else {
                    x.unread.extend_from_slice(&data);
                }
                self.pump(net, x);
            }
            AState::Serving(mut s) => {
                s.serve(net, Pipe::AToDisp, &mut self.served, &[], &data);
                self.state = AState::Serving(s);
            }
            AState::Closed => {}
        }
    }

    fn hello(&mut self, net: &mut Net, head: Vec<u8>) {
        let mut splitter = Splitter::new();
        let split = match splitter.split(&head) {
            Ok(s) => s,
            Err(e) => return self.close(net, &e.to_string()),
        };
        let Some(Frame::Offer { home, binding }) = split.frame else {
            self.state = AState::Hello(head);
            return;
        };
        self.offer = Some((home, binding));
        let rest = &head[split.consumed..];
        // conn/accept.rs peeks the ClientHello's random to keep this connection's traffic secrets
        self.expected = secrets::client_random(rest).and_then(|r| self.log.expect(r));
        let conn = ServerConnection::new(self.config.clone()).expect("server connection");
        self.handshake(net, Box::new(conn), rest);
    }

    fn handshake(&mut self, net: &mut Net, mut conn: Box<ServerConnection>, data: &[u8]) {
        let mut rest = data;
        // tokio-rustls: read (at most 4 KiB a time) and process while the handshake runs; the
        // stream (`ConnIo`) tracks the records rustls takes
        while conn.is_handshaking() && !rest.is_empty() {
            let before = rest;
            if conn.read_tls(&mut rest).is_err() {
                return self.close(net, "read_tls in the handshake");
            }
            let taken = &before[..before.len() - rest.len()];
            match self.read.follow(taken) {
                Ok(Some(end)) => self.boundary = self.followed + end,
                Ok(None) => {}
                Err(e) => return self.close(net, &e.to_string()),
            }
            self.followed += taken.len();
            if let Err(e) = conn.process_new_packets() {
                net.send(Pipe::AToDisp, Msg::Data(drain_tls(&mut *conn)));
                return self.close(net, &format!("handshake: {e}"));
            }
            net.send(Pipe::AToDisp, Msg::Data(drain_tls(&mut *conn)));
        }
        if conn.is_handshaking() {
            self.state = AState::Handshake(conn);
            return;
        }
        // hand_off: the tickets are on the wire (drained above), ahead of the driver's frames
        self.partial_at_cut = self.boundary < self.followed;
        let (home, binding) = self.offer.expect("offered");
        let offered = Offered {
            me: AGENT_A,
            home,
            binding,
            usable: true,
            read: Some(std::mem::take(&mut self.read)),
            boundary: self.boundary as u64,
        };
        let driver = ExportDriver::handshake(offered, self.cap, self.timeouts, net.now);
        let x = Export {
            driver,
            tls: ATls::Engine(conn),
            unread: rest.to_vec(),
            switched: false,
        };
        self.pump(net, Box::new(x));
    }

    /// Does what the driver asks, as `export.rs` does, until it waits for the dispatcher or
    /// the connection's fate is known.
    fn pump(&mut self, net: &mut Net, mut x: Box<Export>) {
        while let Some(step) = x.driver.poll_step() {
            match step {
                ExportStep::Declined | ExportStep::Failed(_) => {}
                // the tickets were drained with the handshake's last flight
                ExportStep::FlushEngine => {}
                ExportStep::Decrypt(tls) => {
                    let ATls::Engine(conn) = &mut x.tls else {
                        return self.close(net, "decrypt without the engine");
                    };
                    match extract::decrypt(conn, &tls, &mut self.plain) {
                        Ok(n) => x.driver.decrypted(Ok(n)),
                        Err(e) => {
                            net.send(Pipe::AToDisp, Msg::Data(drain_tls(&mut **conn)));
                            return self.close(net, &format!("decrypt: {e}"));
                        }
                    }
                }
                ExportStep::Extract { home, binding } => {
                    let how = self.extract(&mut x, home, &binding);
                    x.driver.extracted(how, net.now);
                    x.switched = matches!(x.tls, ATls::Extracted(_));
                    if x.switched && self.crash_after_switch {
                        send_all(net, &mut x.driver);
                        self.state = AState::Closed;
                        net.send(Pipe::AToDisp, Msg::Reset);
                        return;
                    }
                }
                ExportStep::Keep { ciphertext, .. } => {
                    send_all(net, &mut x.driver);
                    let ATls::Engine(conn) = std::mem::replace(&mut x.tls, ATls::Gone) else {
                        return self.close(net, "kept without the engine");
                    };
                    let mut tls = ciphertext.unwrap_or_default();
                    tls.extend_from_slice(&x.unread);
                    let mut s = Serving::Rustls(conn);
                    let plain = std::mem::take(&mut self.plain);
                    s.serve(net, Pipe::AToDisp, &mut self.served, &plain, &tls);
                    self.state = AState::Serving(s);
                    return;
                }
                ExportStep::ServeHere { ciphertext } => {
                    let ATls::Extracted(obj) = std::mem::replace(&mut x.tls, ATls::Gone) else {
                        return self.close(net, "serving here without the object");
                    };
                    let Some(layer) = baton_migrate::record_layer(&obj) else {
                        return self.close(net, "record layer");
                    };
                    let mut s = Serving::Layer(Box::new(layer));
                    s.serve(
                        net,
                        Pipe::AToDisp,
                        &mut self.served,
                        &obj.plaintext,
                        &ciphertext,
                    );
                    self.state = AState::Serving(s);
                    return;
                }
                // the keys are dropped with the object
                ExportStep::Migrated => {
                    self.state = AState::Closed;
                    return;
                }
                ExportStep::Close => return self.close(net, "closed by the export"),
            }
        }
        send_all(net, &mut x.driver);
        if let Some(d) = x.driver.poll_timeout() {
            net.timer(d, Who::A);
        }
        // Bytes after the engine's read, once the driver reads again (after its Switch: after
        // the cut, discarded until the verdict).
        if x.driver.poll_timeout().is_some() && !x.unread.is_empty() {
            let data = std::mem::take(&mut x.unread);
            x.driver.handle(net.now, &data);
            if x.switched && !x.driver.is_finished() {
                self.after_cut += data.len();
            }
            return self.pump(net, x);
        }
        self.state = AState::Exporting(x);
    }

    /// Takes the session out of rustls and seals it, as `export.rs` does.
    fn extract(&mut self, x: &mut Export, home: u16, binding: &[u8]) -> Extraction {
        let ATls::Engine(conn) = &mut x.tls else {
            return Extraction::Failed;
        };
        if !extract::extractable(conn) {
            return Extraction::NotExtractable;
        }
        let ATls::Engine(conn) = std::mem::replace(&mut x.tls, ATls::Gone) else {
            return Extraction::Failed;
        };
        let tls13 = conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3);
        let info = conn_info();
        let extras = Extras {
            home,
            secrets: self.expected.take().map(|e| e.take()).unwrap_or_default(),
            app: info.application(),
            plaintext: std::mem::take(&mut self.plain),
        };
        let Ok(obj) = extract::extract(*conn, extras) else {
            return Extraction::Failed;
        };
        self.extracted = true;
        let keyless = tls13 && (obj.tx.secret.is_none() || obj.rx.secret.is_none());
        let sealed = obj
            .seal(&self.ring, AGENT_A, binding)
            .filter(|_| !self.seal_fails);
        x.tls = ATls::Extracted(Box::new(obj));
        Extraction::Extracted { sealed, keyless }
    }

    fn timer(&mut self, net: &mut Net) {
        if let AState::Exporting(x) = &mut self.state {
            x.driver.handle_timeout(net.now);
            let AState::Exporting(x) = std::mem::replace(&mut self.state, AState::Closed) else {
                return;
            };
            // gives up by closing, never by using the keys
            self.pump(net, x);
        }
    }
}

/// Writes what the driver has for the dispatcher.
fn send_all(net: &mut Net, d: &mut ExportDriver) {
    while let Some(frame) = d.poll_transmit() {
        net.send(Pipe::AToDisp, Msg::Data(frame));
    }
}

enum HState {
    Idle,
    /// The shipped driver, and what the home agent opened for it.
    Importing(ImportDriver, Option<Box<(SessionObject, RecordLayer)>>),
    /// Opened; the answer is due at the instant (a late home agent).
    Answering(ImportDriver, Box<(SessionObject, RecordLayer)>, Instant),
    Serving(Serving),
    Closed,
}

/// The home agent: the shipped `ImportDriver` pumped as `import.rs` pumps it, with the faults
/// of a process (stopped, late, crashed).
struct HomeAgent {
    state: HState,
    ring: KeyRing,
    guard: ReplayGuard,
    started: SystemTime,
    timeouts: Timeouts,
    fault: Fault,
    /// Stopped (SIGSTOP) until this instant; messages wait.
    stopped_until: Option<Option<Instant>>,
    backlog: VecDeque<Msg>,
    dead: bool,
    /// What this agent did for the client.
    served: Served,
}

impl HomeAgent {
    fn new(s: &Schedule) -> Self {
        let ring = match s.fault {
            Fault::HomeWrongKey => cluster_ring(2),
            _ => cluster_ring(1),
        };
        let started = match s.fault {
            Fault::HomeRestarted => SystemTime::now() + Duration::from_secs(1),
            _ => SystemTime::now() - Duration::from_secs(1),
        };
        Self {
            state: HState::Idle,
            ring,
            guard: ReplayGuard::new(1024),
            started,
            timeouts: s.timeouts,
            fault: s.fault,
            stopped_until: None,
            backlog: VecDeque::new(),
            dead: false,
            served: Served::default(),
        }
    }

    fn close(&mut self, net: &mut Net, why: &str) {
        self.served.errors.push(format!("home agent: {why}"));
        self.state = HState::Closed;
        net.send(Pipe::HomeToDisp, Msg::Reset);
    }

    fn input(&mut self, net: &mut Net, m: Msg) {
        if self.dead {
            return;
        }
        if matches!(self.state, HState::Idle) && self.stopped_until.is_none() {
            if let Fault::HomeHung(until) = self.fault {
                self.stopped_until = Some(until.map(|d| net.now + d));
                if let Some(Some(at)) = self.stopped_until {
                    net.timer(at, Who::Home);
                }
            }
        }
        let stopped = match self.stopped_until {
            Some(None) => true,
            Some(Some(at)) => net.now < at,
            None => false,
        };
        self.backlog.push_back(m);
        if stopped || matches!(self.state, HState::Answering(..)) {
            return;
        }
        self.run_backlog(net);
    }

    fn process(&mut self, net: &mut Net, m: Msg) {
        match std::mem::replace(&mut self.state, HState::Closed) {
            HState::Idle => {
                let driver = ImportDriver::new(self.timeouts, net.now);
                self.state = HState::Importing(driver, None);
                self.process(net, m);
            }
            HState::Importing(mut d, opened) => {
                match m {
                    Msg::Data(data) => d.handle(net.now, &data),
                    _ => d.closed(),
                }
                self.pump(net, d, opened);
            }
            HState::Serving(mut s) => match m {
                Msg::Data(data) => {
                    s.serve(net, Pipe::HomeToDisp, &mut self.served, &[], &data);
                    self.state = HState::Serving(s);
                }
                Msg::Eof => self.state = HState::Serving(s),
                _ => {}
            },
            HState::Answering(..) => unreachable!("backlogged"),
            HState::Closed => {}
        }
    }

    /// Does what the driver asks, as `import.rs` does.
    fn pump(
        &mut self,
        net: &mut Net,
        mut d: ImportDriver,
        mut opened: Option<Box<(SessionObject, RecordLayer)>>,
    ) {
        while let Some(step) = d.poll_step() {
            match step {
                ImportStep::Open(sealed) => {
                    let result = SessionObject::open(
                        &sealed,
                        &self.ring,
                        AGENT_H,
                        &binding(),
                        SystemTime::now(),
                        self.started,
                        &mut self.guard,
                    )
                    .map_err(|e| super::import::refusal(e).1)
                    .and_then(|obj| match baton_migrate::record_layer(&obj) {
                        Some(layer) => Ok((obj, layer)),
                        None => Err(RefuseReason::Invalid),
                    });
                    match result {
                        Ok(o) => {
                            let due = match self.fault {
                                Fault::HomeLate(late) => net.now + late,
                                _ => net.now,
                            };
                            self.state = HState::Answering(d, Box::new(o), due);
                            if due > net.now {
                                net.timer(due, Who::Home);
                            } else {
                                self.answer(net);
                            }
                            return;
                        }
                        Err(reason) => d.opened(Err(reason), net.now),
                    }
                }
                ImportStep::Failed(_) => {}
                ImportStep::Commit { ciphertext } => {
                    let Some(o) = opened.take() else {
                        return self.close(net, "commit without an object");
                    };
                    let (obj, layer) = *o;
                    let mut s = Serving::Layer(Box::new(layer));
                    s.serve(
                        net,
                        Pipe::HomeToDisp,
                        &mut self.served,
                        &obj.plaintext,
                        &ciphertext,
                    );
                    self.state = HState::Serving(s);
                    return;
                }
                // the keys, if any, are dropped unused
                ImportStep::Close => {
                    while let Some(frame) = d.poll_transmit() {
                        net.send(Pipe::HomeToDisp, Msg::Data(frame));
                    }
                    return self.close(net, "closed by the import");
                }
            }
        }
        while let Some(frame) = d.poll_transmit() {
            net.send(Pipe::HomeToDisp, Msg::Data(frame));
        }
        if let Some(t) = d.poll_timeout() {
            net.timer(t, Who::Home);
        }
        self.state = HState::Importing(d, opened);
    }

    /// Ready, once the (possibly late) home agent answers.
    fn answer(&mut self, net: &mut Net) {
        let HState::Answering(mut d, opened, _) =
            std::mem::replace(&mut self.state, HState::Closed)
        else {
            return;
        };
        d.opened(Ok(()), net.now);
        if self.fault == Fault::HomeCrashAfterReady {
            while let Some(frame) = d.poll_transmit() {
                net.send(Pipe::HomeToDisp, Msg::Data(frame));
            }
            self.dead = true;
            net.send(Pipe::HomeToDisp, Msg::Reset);
            return;
        }
        self.pump(net, d, Some(opened));
        self.run_backlog(net);
    }

    fn run_backlog(&mut self, net: &mut Net) {
        while !matches!(self.state, HState::Answering(..)) {
            let Some(m) = self.backlog.pop_front() else {
                return;
            };
            self.process(net, m);
        }
    }

    fn timer(&mut self, net: &mut Net) {
        if self.dead {
            return;
        }
        match self.stopped_until {
            Some(None) => return,
            Some(Some(at)) if net.now < at => return,
            // SIGCONT: what arrived meanwhile, in order
            Some(Some(_)) if !matches!(self.state, HState::Answering(..)) => self.run_backlog(net),
            _ => {}
        }
        if let HState::Answering(_, _, due) = &self.state {
            if net.now >= *due {
                self.answer(net);
            }
            return;
        }
        if let HState::Importing(..) = self.state {
            let HState::Importing(mut d, opened) =
                std::mem::replace(&mut self.state, HState::Closed)
            else {
                return;
            };
            // gives up by closing, never by using the keys
            d.handle_timeout(net.now);
            self.pump(net, d, opened);
        }
    }
}

#[cfg(test)]
#[path = "harness_test.rs"]
mod harness_test;
