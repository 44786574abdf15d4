/**
 * `Symbol.asyncDispose` and `Symbol.dispose` where the runtime lacks them
 * (Node.js before 20.4/18.18), defined as Node.js defines them: the
 * registered symbols `nodejs.asyncDispose` and `nodejs.dispose`, so that
 * they are the same symbols Node.js itself and other polyfills use.
 * Imported first by every module that names them.
 */
const symbols = Symbol as unknown as { asyncDispose?: symbol; dispose?: symbol };
if (typeof symbols.asyncDispose !== "symbol") {
  Object.defineProperty(Symbol, "asyncDispose", { value: Symbol.for("nodejs.asyncDispose") });
}
if (typeof symbols.dispose !== "symbol") {
  Object.defineProperty(Symbol, "dispose", { value: Symbol.for("nodejs.dispose") });
}
export {};
