/** Small helpers: the monotonic clock, abortable sleeps. */

import { setMaxListeners } from "node:events";

/** Milliseconds on the monotonic clock. */
export function now(): number {
  return performance.now();
}

/** Why an aborted signal aborted (its reason, or an AbortError). */
export function reasonOf(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/**
 * Resolves after `ms` (at least 0), or rejects with the signal's reason when
 * it aborts first.
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) {
      reject(reasonOf(signal));
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(reasonOf(signal!));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, Math.ceil(ms)));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A signal that aborts when any of `signals` does (with its reason); `dispose`
 * removes the listeners.
 */
export function linked(signals: ReadonlyArray<AbortSignal | undefined>): {
  controller: AbortController;
  dispose: () => void;
} {
  const controller = new AbortController();
  // One listener per wait under way on it: many at once is the normal case.
  setMaxListeners(0, controller.signal);
  const undo: Array<() => void> = [];
  for (const s of signals) {
    if (s === undefined) continue;
    if (s.aborted) {
      controller.abort(reasonOf(s));
      break;
    }
    const on = (): void => controller.abort(reasonOf(s));
    s.addEventListener("abort", on, { once: true });
    undo.push(() => s.removeEventListener("abort", on));
  }
  return {
    controller,
    dispose: () => {
      for (const u of undo) u();
    },
  };
}

/** A duration for messages: `500 ms`, `3 s`, `1.5 s`. */
export function showMs(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${Number((ms / 1000).toFixed(3))} s`;
}
