// cc-app-server for Node: `AppServerClient` (a `cc-app-server serve` child process), the fixed-
// capability `AppServerPilotClient`, the error classes, and the generated wire-v1 types and codecs
// (re-exported from ./protocol.js, which the build copies from bindings/typescript/src/protocol.ts;
// also importable as "cc-app-server/protocol").

export * from "./protocol.js";
export {
  AppServerClient,
  TurnStream,
  resolveBinary,
  CLIENT_FEATURES,
  DEFAULT_APPROVAL_TIMEOUT_MS,
  DEFAULT_CLOSE_TIMEOUT_MS,
  DEFAULT_MAX_INBOUND_LINE_BYTES,
  DEFAULT_MAX_OUTSTANDING_APPROVALS,
  DEFAULT_NOTIFICATION_CAPACITY,
  DEFAULT_REQUEST_TIMEOUT_MS,
  MAX_LINE_BYTES,
  MAX_PENDING_REQUESTS,
  PROTOCOL_VERSION,
  type Method,
  type ParamsOf,
  type RequestOptions,
  type ResultMap,
  type ResultOf,
  type SpawnOptions,
  type TurnOptions,
} from "./client.js";
export { AppServerPilotClient, PILOT_METHODS, type PilotSpawnOptions } from "./pilot.js";
export { NO_HANDLER, type ApprovalHandler, type Decision, type DecisionName, type Logger } from "./approvals.js";
export {
  AppServerError,
  Closed,
  Conflict,
  InvalidParams,
  KernelFailed,
  NotFound,
  Overloaded,
  ProtocolError,
  ServerExited,
  Timeout,
  TurnInterrupted,
} from "./errors.js";
