//! The tests' certificates, issued with the lab's `Ca`, and ticket / cluster key files.

use std::process::Command;

use baton_cluster::pki::{key_pair, Ca, KeyKind};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::{TempDir, BATON};

/// A CA, an ECDSA and an RSA server certificate for `localhost`/127.0.0.1 signed by it, a
/// client CA and a client certificate, as PEM files:
/// `ca.pem`, `ecdsa.pem`/`ecdsa.key`, `rsa.pem`/`rsa.key`, `client-ca.pem`,
/// `client.pem`/`client.key`, `other-client.pem`/`other-client.key` (signed by an unrelated CA),
/// `other.pem`/`other.key` (ECDSA, for `other.test` and `*.wild.test`).
pub struct Pki {
    pub dir: TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = TempDir::new("pki");
        let write = |name: &str, text: &str| std::fs::write(dir.path(name), text).unwrap();
        // a certificate from `ca` for a new key of `kind`, as `NAME.pem` and `NAME.key`
        let issue = |ca: &Ca, name: &str, kind: KeyKind, names: &[&str], cn: &str| {
            let key = key_pair(kind).unwrap();
            write(&format!("{name}.pem"), &ca.issue(names, cn, &key).unwrap());
            write(&format!("{name}.key"), &key.serialize_pem());
        };
        let localhost = ["localhost", "127.0.0.1"];

        let ca = Ca::new("Baton Test CA").unwrap();
        write("ca.pem", ca.pem());
        issue(&ca, "ecdsa", KeyKind::EcdsaP256, &localhost, "localhost");
        issue(&ca, "rsa", KeyKind::Rsa(2048), &localhost, "localhost");
        // a second site, for SNI
        let other = ["other.test", "*.wild.test"];
        issue(&ca, "other", KeyKind::EcdsaP256, &other, "other.test");

        let client_ca = Ca::new("Baton Client CA").unwrap();
        write("client-ca.pem", client_ca.pem());
        issue(&client_ca, "client", KeyKind::EcdsaP256, &[], "client-one");

        let unrelated = Ca::new("Unrelated CA").unwrap();
        issue(
            &unrelated,
            "other-client",
            KeyKind::EcdsaP256,
            &[],
            "intruder",
        );
        Pki { dir }
    }

    pub fn arg(&self, name: &str) -> String {
        self.dir.arg(name)
    }

    pub fn certs(&self, name: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_file_iter(self.dir.path(name))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    pub fn key(&self, name: &str) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_file(self.dir.path(name)).unwrap()
    }

    /// The `--cert/--key` flags for the ECDSA and RSA server certificates.
    pub fn server_args(&self) -> Vec<String> {
        ["ecdsa", "rsa"]
            .iter()
            .flat_map(|k| {
                [
                    "--cert".to_string(),
                    self.arg(&format!("{k}.pem")),
                    "--key".to_string(),
                    self.arg(&format!("{k}.key")),
                ]
            })
            .collect()
    }

    /// A rustls client config trusting the test CA, for the given versions, with an optional
    /// client certificate (`client` / `other-client`).
    pub fn client(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        client_cert: Option<&str>,
    ) -> rustls::ClientConfig {
        let roots = baton_lab::soak::load::roots(&self.dir.path("ca.pem")).unwrap();
        let b = rustls::ClientConfig::builder_with_protocol_versions(versions)
            .with_root_certificates(roots);
        match client_cert {
            Some(name) => b
                .with_client_auth_cert(
                    self.certs(&format!("{name}.pem")),
                    self.key(&format!("{name}.key")),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        }
    }
}

/// A new key file (`baton ticket-key`) in `dir`; its path.
pub fn key_file(dir: &TempDir, name: &str) -> String {
    let path = dir.arg(name);
    assert!(Command::new(BATON)
        .args(["ticket-key", "--out", &path])
        .status()
        .unwrap()
        .success());
    path
}

/// A cluster key file in `dir` with the keys `lines` ("ID HEX" each), private as the servers
/// require; its path.
pub fn cluster_key_file(dir: &TempDir, name: &str, lines: &[&str]) -> String {
    let path = dir.arg(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}
