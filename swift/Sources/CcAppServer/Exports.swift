// `import CcAppServer` is all a host writes: the generated protocol types (AgentThread, Turn,
// ServerNotification, ThreadStartResult, …) come with the SDK.
@_exported import CcAppServerProtocol
