//! Moving an *established* session without sockets: a rustls client and an agent
//! that have exchanged requests (and, in TLS 1.3, KeyUpdates) long after their handshake; the
//! agent drains and leaves, the dispatcher's relay (which followed every byte while it served)
//! moves the connection to a second agent, which carries it on from the record layer; that one
//! drains in turn and the session moves again, out of its record layer. The agents run the
//! shipped drivers (`ExportDriver::leave`, `ImportDriver`) with the same TLS functions as the
//! tokio shells. The client must never see an error, and every request must be answered once,
//! in order, by whoever held the keys.

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use baton_migrate::{
    Action, ExportDriver, ExportStep, Extraction, Frame, ImportDriver, ImportStep, Outcome, Relay,
    Splitter, Target, BINDING_LEN,
};
use baton_record::RecordLayer;
use baton_session::migration::{ReplayGuard, SessionObject, MAX_CARRIED_PLAINTEXT};
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ServerConnection};

use super::harness::{client_config, cluster_ring, conn_info, pattern, server_config};
use baton_migrate::extract::{self, Extras};
use baton_migrate::secrets::{self, SecretLog, TrafficSecrets};

const T: baton_migrate::Timeouts = baton_migrate::Timeouts::new(Duration::from_millis(50));

/// Everything that is not the client: the relay's view and what it asked for.
struct Dispatcher {
    relay: Relay,
    to_agent: Vec<u8>,
    to_home: Vec<u8>,
    spliced: Option<Target>,
    choose: usize,
}

impl Dispatcher {
    fn take(&mut self) {
        while let Some(a) = self.relay.poll_action() {
            match a {
                Action::ToAgent(b) if b == Frame::Done.to_bytes() => {}
                Action::ToAgent(b) => self.to_agent.extend(b),
                Action::ToHome(b) => self.to_home.extend(b),
                Action::ChooseHome => self.choose += 1,
                Action::ConnectHome => self.relay.home_connected(),
                Action::Splice(t) => self.spliced = Some(t),
                Action::ToClient(b) => panic!("{} bytes for the client from the relay", b.len()),
                Action::CloseAgent | Action::CloseHome => {}
            }
        }
    }
}

/// Client bytes through the serving relay to an agent's input; agent bytes back to the client.
fn client_to(d: &mut Dispatcher, client: &mut ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    client.write_tls(&mut out).unwrap();
    if d.relay.is_serving() {
        d.relay.watch_client(&out).unwrap();
        out
    } else {
        d.relay.from_client(&out).unwrap();
        d.take();
        std::mem::take(&mut d.to_agent)
    }
}

fn agent_to_client(d: &mut Dispatcher, client: &mut ClientConnection, bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        let p = d.relay.watch_agent(rest).unwrap();
        let mut tls = &rest[..p.tls];
        while !tls.is_empty() {
            client.read_tls(&mut tls).unwrap();
        }
        client
            .process_new_packets()
            .expect("the client sees no TLS error");
        assert!(
            matches!(p.frame, None | Some(Frame::Leave)),
            "an agent sends no other frame while it serves"
        );
        rest = &rest[p.consumed..];
    }
}

fn read_all(client: &mut ClientConnection) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = client.reader().read_to_end(&mut v);
    v
}

/// An agent serving from the record layer: decrypts what it gets, echoes requests back.
fn layer_serves(layer: &mut RecordLayer, tls: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut rest = tls;
    let mut plain = Vec::new();
    loop {
        let n = layer.read_tls(rest);
        rest = &rest[n..];
        layer.process().unwrap();
        let p = layer.plaintext().to_vec();
        layer.consume_plaintext(p.len());
        plain.extend(p);
        if rest.is_empty() {
            break;
        }
    }
    if !plain.is_empty() {
        layer.write_plaintext(&plain).unwrap();
    }
    let out = layer.pending_tls().to_vec();
    layer.consume_tls(out.len());
    (plain, out)
}

/// The binding of a move to agent `home`: a link id and a token of the test's choosing.
fn binding(home: u16) -> [u8; BINDING_LEN] {
    let mut b = [home as u8; BINDING_LEN];
    b[16..].copy_from_slice(&[0x5a; 16]);
    b
}

/// The importer's side at agent `me`: opens the object bound to it, Ready, then Commit; the
/// layer it serves from and what it serves first (the plaintext carried, the bytes held).
fn import(
    d: &mut Dispatcher,
    me: u16,
    ring: &baton_session::KeyRing,
) -> (RecordLayer, SessionObject, Vec<u8>) {
    let now = Instant::now();
    let mut importer = ImportDriver::new(T, now);
    importer.handle(now, &std::mem::take(&mut d.to_home));
    let Some(ImportStep::Open(sealed)) = importer.poll_step() else {
        panic!("an Import first");
    };
    let mut guard = ReplayGuard::new(16);
    let started = SystemTime::now() - Duration::from_secs(1);
    let binding = binding(me);
    let obj = SessionObject::open(
        &sealed,
        ring,
        me,
        &binding,
        SystemTime::now(),
        started,
        &mut guard,
    )
    .expect("the object opens at the agent it is bound to");
    importer.opened(Ok(()), now);
    let ready = importer.poll_transmit().expect("Ready");
    d.relay.from_home(&ready).unwrap();
    d.take();
    importer.handle(now, &std::mem::take(&mut d.to_home));
    let Some(ImportStep::Commit { ciphertext }) = importer.poll_step() else {
        panic!("Commit after Ready");
    };
    let layer = baton_migrate::record_layer(&obj).expect("a record layer for the session");
    (layer, obj, ciphertext)
}

/// The engine a leaving agent serves from.
enum Tls {
    Rustls(Box<ServerConnection>),
    /// The record layer, and the session's (version, suite).
    Layer(Box<RecordLayer>, (u16, u16)),
}

/// The leaving agent's side from the dispatcher's answer to its Switch, as `export.rs` pumps
/// `ExportDriver`: `input` is what the dispatcher sent after the Leave (client records, then
/// the Offer naming `home`). Returns the Switch frame and the object taken out.
fn switch_out(
    x: &mut ExportDriver,
    tls: Tls,
    input: &[u8],
    (me, home): (u16, u16),
    secrets: TrafficSecrets,
    ring: &baton_session::KeyRing,
) -> (Vec<u8>, SessionObject) {
    let now = Instant::now();
    x.handle(now, input);
    let (mut tls, mut secrets) = (Some(tls), Some(secrets));
    let (mut plain, mut obj) = (Vec::new(), None);
    while let Some(step) = x.poll_step() {
        match step {
            ExportStep::Decrypt(bytes) => {
                let n = match tls.as_mut() {
                    Some(Tls::Rustls(s)) => extract::decrypt(s, &bytes, &mut plain).unwrap(),
                    _ => {
                        assert!(bytes.is_empty(), "nothing came before the Offer");
                        0
                    }
                };
                x.decrypted(Ok(n));
            }
            ExportStep::Extract {
                home: to,
                binding: b,
            } => {
                assert_eq!((to, b), (home, binding(home)), "the Offer is the cut");
                let info = conn_info();
                let extras = Extras {
                    home,
                    secrets: secrets.take().unwrap_or_default(),
                    app: info.application(),
                    plaintext: std::mem::take(&mut plain),
                };
                let o = match tls.take() {
                    Some(Tls::Rustls(mut s)) => {
                        assert!(extract::extractable(&mut s));
                        extract::extract(*s, extras).unwrap()
                    }
                    Some(Tls::Layer(l, suite)) => {
                        let keys = l.export().expect("the layer is at rest between requests");
                        extract::from_layer(&keys, suite, extras).unwrap()
                    }
                    None => panic!("extracted twice"),
                };
                let sealed = o.seal(ring, me, &binding(home));
                x.extracted(
                    Extraction::Extracted {
                        sealed,
                        keyless: false,
                    },
                    now,
                );
                obj = Some(o);
            }
            other => panic!("the leaving agent was asked to {other:?}"),
        }
    }
    let switch = x.poll_transmit().expect("a Switch");
    (switch, obj.expect("extracted"))
}

/// The new agent starts serving: what was carried first, then the held records.
fn first_served(layer: &mut RecordLayer, obj: &SessionObject, held: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let carried = obj.plaintext.to_vec();
    if !carried.is_empty() {
        layer.write_plaintext(&carried).unwrap();
    }
    let (more, out) = layer_serves(layer, held);
    ([carried, more].concat(), out)
}

#[test]
fn an_established_session_leaves_a_draining_agent_twice() {
    let ring = cluster_ring(3);
    for tls13 in [true, false] {
        // The handshake, then two requests and (TLS 1.3) a KeyUpdate, on agent 1's rustls.
        let log = Arc::new(SecretLog::default());
        let mut client = ClientConnection::new(
            client_config(tls13),
            ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        let mut server = ServerConnection::new(server_config(log.clone())).unwrap();
        let mut d = Dispatcher {
            relay: Relay::serving(),
            to_agent: Vec::new(),
            to_home: Vec::new(),
            spliced: None,
            choose: 0,
        };
        let mut read = Splitter::new();
        let mut expected = None;
        while client.is_handshaking() || server.is_handshaking() {
            let bytes = client_to(&mut d, &mut client);
            if expected.is_none() {
                expected = secrets::client_random(&bytes).and_then(|r| log.expect(r));
            }
            read.track(&bytes).unwrap();
            server.read_tls(&mut &bytes[..]).unwrap();
            server.process_new_packets().unwrap();
            let mut out = Vec::new();
            server.write_tls(&mut out).unwrap();
            agent_to_client(&mut d, &mut client, &out);
        }
        let secrets = expected.map(|e| e.take()).unwrap_or_default();
        let mut sent = 0;
        let mut served = Vec::new();
        for round in 0..2 {
            if tls13 && round == 1 {
                client.refresh_traffic_keys().unwrap();
            }
            client.writer().write_all(&pattern(sent, 300)).unwrap();
            sent += 300;
            let bytes = client_to(&mut d, &mut client);
            read.track(&bytes).unwrap();
            let mut plain = Vec::new();
            extract::decrypt(&mut server, &bytes, &mut plain).unwrap();
            server.writer().write_all(&plain).unwrap();
            served.extend(plain);
            let mut out = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut out).unwrap();
            }
            agent_to_client(&mut d, &mut client, &out);
        }
        assert_eq!(read_all(&mut client), pattern(0, sent));

        // Agent 1 drains: Leave. The client's next request is on its way meanwhile.
        let (mut x, leave) =
            ExportDriver::leave(true, Some(read), MAX_CARRIED_PLAINTEXT, T, Instant::now());
        agent_to_client(&mut d, &mut client, &leave.expect("a Leave"));
        d.take();
        assert_eq!(d.choose, 1);
        client.writer().write_all(&pattern(sent, 200)).unwrap();
        sent += 200;
        // the relay still gives the leaving agent the client's bytes, then the Offer
        let racing = client_to(&mut d, &mut client);
        d.relay.move_to(2, binding(2));
        d.take();
        let input = [racing, std::mem::take(&mut d.to_agent)].concat();
        let server = Tls::Rustls(Box::new(server));
        let (switch, obj) = switch_out(&mut x, server, &input, (1, 2), secrets, &ring);
        if tls13 {
            // generation 0 from the key log, followed through the KeyUpdates to rustls' keys
            assert!(obj.tx.secret.is_some() && obj.rx.secret.is_some());
        }
        d.relay.from_agent(&switch).unwrap();
        d.take();
        let (mut layer, obj2, held) = import(&mut d, 2, &ring);
        assert_eq!(d.spliced.take(), Some(Target::HomeAgent));
        assert_eq!(d.relay.outcome(), Some(Outcome::Migrated));
        x.handle(Instant::now(), &Frame::Done.to_bytes());
        assert_eq!(x.poll_step(), Some(ExportStep::Migrated));
        let (first, out) = first_served(&mut layer, &obj2, &held);
        served.extend(first);
        agent_to_client(&mut d, &mut client, &out);
        // agent 2 serves on: a KeyUpdate from the client, and another request
        if tls13 {
            client.refresh_traffic_keys().unwrap();
        }
        client.writer().write_all(&pattern(sent, 150)).unwrap();
        sent += 150;
        let bytes = client_to(&mut d, &mut client);
        let (plain, out) = layer_serves(&mut layer, &bytes);
        served.extend(plain);
        agent_to_client(&mut d, &mut client, &out);

        // Agent 2 drains in turn: the session leaves its record layer for agent 3.
        let mut read = Splitter::new();
        read.track(layer.undecrypted()).unwrap();
        let (mut x, leave) =
            ExportDriver::leave(true, Some(read), MAX_CARRIED_PLAINTEXT, T, Instant::now());
        agent_to_client(&mut d, &mut client, &leave.expect("a Leave"));
        d.take();
        assert_eq!(d.choose, 2);
        d.relay.move_to(3, binding(3));
        d.take();
        let input = std::mem::take(&mut d.to_agent);
        let suite = (obj2.version, obj2.suite);
        let layer2 = Tls::Layer(Box::new(layer), suite);
        let (switch, _) = switch_out(&mut x, layer2, &input, (2, 3), Default::default(), &ring);
        d.relay.from_agent(&switch).unwrap();
        d.take();
        let (mut layer, obj3, held) = import(&mut d, 3, &ring);
        assert_eq!(d.spliced.take(), Some(Target::HomeAgent));
        let (first, out) = first_served(&mut layer, &obj3, &held);
        served.extend(first);
        agent_to_client(&mut d, &mut client, &out);
        if tls13 {
            client.refresh_traffic_keys().unwrap();
        }
        client.writer().write_all(&pattern(sent, 100)).unwrap();
        sent += 100;
        let bytes = client_to(&mut d, &mut client);
        let (plain, out) = layer_serves(&mut layer, &bytes);
        served.extend(plain);
        agent_to_client(&mut d, &mut client, &out);

        // Every request acted on once, in order, and every answer reached the client.
        assert_eq!(served, pattern(0, sent), "tls13={tls13}");
        assert_eq!(
            read_all(&mut client),
            pattern(300 * 2, sent - 600),
            "tls13={tls13}"
        );
    }
}
