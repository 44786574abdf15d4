/** TLS settings: the CA that signs the nodes' certificates, a client certificate. */

import { readFileSync } from "node:fs";
import * as net from "node:net";
import * as tls from "node:tls";

import { InvalidArgumentError } from "./errors.js";

/** PEM text, as a string or bytes. */
export type Pem = string | Buffer;

/** How to speak TLS to the nodes. */
export interface TlsOptions {
  /** The CA certificate(s) that sign the nodes' certificates (PEM). Only these are trusted, not the system's. */
  readonly ca: Pem | readonly Pem[];
  /** This client's certificate chain (PEM), for nodes that require one; with `key`. */
  readonly cert?: Pem;
  /** The private key of `cert` (PEM, unencrypted). */
  readonly key?: Pem;
  /** The name to expect in every node's certificate instead of the host dialed. */
  readonly serverName?: string;
}

/** Paths of the PEM files of {@link TlsOptions}. */
export interface TlsFiles {
  readonly caFile: string;
  readonly certFile?: string;
  readonly keyFile?: string;
  readonly serverName?: string;
}

function read(path: string, what: string): Buffer {
  try {
    return readFileSync(path);
  } catch (e) {
    throw new InvalidArgumentError(`TLS: cannot read the ${what} ${path}: ${(e as Error).message}`);
  }
}

/** Reads the PEM files (at once: a missing file throws InvalidArgumentError here). */
export function tlsFromFiles(files: TlsFiles): TlsOptions {
  if ((files.certFile === undefined) !== (files.keyFile === undefined)) {
    throw new InvalidArgumentError("TLS: a client certificate needs its key, and a key its certificate");
  }
  return {
    ca: read(files.caFile, "CA file"),
    ...(files.certFile !== undefined ? { cert: read(files.certFile, "certificate") } : {}),
    ...(files.keyFile !== undefined ? { key: read(files.keyFile, "key") } : {}),
    ...(files.serverName !== undefined ? { serverName: files.serverName } : {}),
  };
}

/**
 * The TLS settings of the `ringlock` command line, from the environment:
 * `RINGLOCK_TLS_CA` (turns TLS on), `RINGLOCK_TLS_CERT` and
 * `RINGLOCK_TLS_KEY` (together), `RINGLOCK_TLS_SERVER_NAME`; unset or empty
 * ones count as absent. Undefined (plain text) when none is set.
 */
export function tlsFromEnv(env: NodeJS.ProcessEnv = process.env): TlsOptions | undefined {
  const get = (name: string): string | undefined => {
    const v = env[name];
    return v === undefined || v === "" ? undefined : v;
  };
  const caFile = get("RINGLOCK_TLS_CA");
  const certFile = get("RINGLOCK_TLS_CERT");
  const keyFile = get("RINGLOCK_TLS_KEY");
  const serverName = get("RINGLOCK_TLS_SERVER_NAME");
  if (caFile === undefined) {
    if (certFile !== undefined || keyFile !== undefined || serverName !== undefined) {
      throw new InvalidArgumentError("TLS: RINGLOCK_TLS_CERT, _KEY or _SERVER_NAME is set without RINGLOCK_TLS_CA");
    }
    return undefined;
  }
  return tlsFromFiles({
    caFile,
    ...(certFile !== undefined ? { certFile } : {}),
    ...(keyFile !== undefined ? { keyFile } : {}),
    ...(serverName !== undefined ? { serverName } : {}),
  });
}

/** The checked form the dialer uses. */
export interface TlsSetup {
  readonly context: tls.SecureContext;
  readonly serverName: string | undefined;
}

/** Checks the options once (bad PEM, a key that does not match: InvalidArgumentError). */
export function tlsSetup(options: TlsOptions): TlsSetup {
  if ((options.cert === undefined) !== (options.key === undefined)) {
    throw new InvalidArgumentError("TLS: a client certificate needs its key, and a key its certificate");
  }
  const ca = Array.isArray(options.ca) ? [...(options.ca as readonly Pem[])] : [options.ca as Pem];
  if (ca.length === 0 || !ca.some((c) => c.toString().includes("-----BEGIN CERTIFICATE-----"))) {
    throw new InvalidArgumentError("TLS: the CA holds no PEM certificate");
  }
  try {
    const context = tls.createSecureContext({
      ca,
      minVersion: "TLSv1.2",
      ...(options.cert !== undefined ? { cert: options.cert, key: options.key } : {}),
    });
    return { context, serverName: options.serverName };
  } catch (e) {
    throw new InvalidArgumentError(`TLS: ${(e as Error).message}`);
  }
}

/** Dials `host:port` with TLS; the caller bounds the time. */
export function connectTls(setup: TlsSetup, host: string, port: number): tls.TLSSocket {
  const name = setup.serverName;
  return tls.connect({
    host,
    port,
    secureContext: setup.context,
    rejectUnauthorized: true,
    minVersion: "TLSv1.2",
    // SNI takes a DNS name, never an IP address.
    ...(name !== undefined && net.isIP(name) === 0
      ? { servername: name }
      : net.isIP(host) === 0
        ? { servername: host }
        : {}),
    checkServerIdentity: (hostname, cert) => tls.checkServerIdentity(name ?? hostname, cert),
  });
}

/** A TLS failure in words, or undefined when `err` is not one. */
export function explainTls(err: unknown): string | undefined {
  if (!(err instanceof Error)) return undefined;
  const code = (err as NodeJS.ErrnoException).code ?? "";
  const msg = err.message;
  const why = (text: string): string => `TLS: ${text} (${msg})`;
  switch (code) {
    case "UNABLE_TO_VERIFY_LEAF_SIGNATURE":
    case "UNABLE_TO_GET_ISSUER_CERT_LOCALLY":
    case "UNABLE_TO_GET_ISSUER_CERT":
    case "SELF_SIGNED_CERT_IN_CHAIN":
    case "DEPTH_ZERO_SELF_SIGNED_CERT":
    case "CERT_SIGNATURE_FAILURE":
      return why("the server's certificate is not signed by the CA given (tls.ca)");
    case "CERT_HAS_EXPIRED":
      return why("the server's certificate has expired");
    case "CERT_NOT_YET_VALID":
      return why("the server's certificate is not valid yet");
    case "ERR_TLS_CERT_ALTNAME_INVALID":
      return why("the server's certificate does not name the address dialed (see tls.serverName)");
    case "ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED":
    case "ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE":
      return why("the server requires a client certificate (tls.cert and tls.key)");
    case "ERR_SSL_TLSV1_ALERT_UNKNOWN_CA":
    case "ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE":
    case "ERR_SSL_TLSV1_ALERT_DECRYPT_ERROR":
      return why("the server does not accept our client certificate (not signed by its client CA)");
    case "ERR_SSL_WRONG_VERSION_NUMBER":
    case "ERR_SSL_PACKET_LENGTH_TOO_LONG":
      return why("the server did not answer in TLS (a plain-text port?)");
    default:
      return code.startsWith("ERR_SSL_") || code.startsWith("ERR_TLS_") ? `TLS: ${msg}` : undefined;
  }
}
