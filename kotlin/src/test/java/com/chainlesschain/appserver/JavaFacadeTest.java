// A plain-Java host using only the Java facade (JavaAppServer, JavaClient, Decision, the
// generated protocol types): blocking calls, CompletableFutures, a java.util.function approval
// callback and a Consumer subscription. Runs under JUnit (mvn verify) and, through main(), on a
// plain `java -cp jar:deps` classpath with no JUnit and no -Djna.library.path (scripts/test-jvm.sh).
package com.chainlesschain.appserver;

import com.chainlesschain.appserver.protocol.ApprovalOutcome;
import com.chainlesschain.appserver.protocol.ServerNotification;
import com.chainlesschain.appserver.protocol.ToolResult;
import com.chainlesschain.appserver.protocol.TurnStatus;
import java.nio.file.Files;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

public class JavaFacadeTest {
    private static final String TOOL_SCRIPT =
        "{\"steps\":[{\"type\":\"tool\",\"tool\":\"fs.write\",\"arguments\":{\"path\":\"a.txt\",\"text\":\"x\"}},"
            + "{\"type\":\"message\",\"text\":\"done\",\"chunks\":2}]}";

    private static void check(boolean ok, String what) {
        PlainRun.check(ok, what);
    }

    private static String stateDir() throws Exception {
        java.nio.file.Path dir = Files.createTempDirectory("cc-java-test");
        // Removed when the JVM exits (the servers have closed by then).
        Runtime.getRuntime().addShutdownHook(new Thread(() -> deleteTree(dir.toFile())));
        return dir.resolve("state").toString();
    }

    private static void deleteTree(java.io.File f) {
        java.io.File[] children = f.listFiles();
        if (children != null) {
            for (java.io.File c : children) deleteTree(c);
        }
        if (!f.delete() && f.exists()) System.err.println("could not delete " + f);
    }

    /**
     * The hot path must not silently turn off: on a plain classpath (no jna.library.path) the jar's
     * library is copied once to a private cache and both JNA and JNI load that file.
     */
    @Test
    public void theJniHotPathIsOnUnlessTurnedOff() throws Exception {
        boolean off = "false".equals(System.getProperty("cc.appserver.jni"));
        try (JavaAppServer server = JavaAppServer.open(stateDir());
             JavaClient client = server.client()) {
            check(client.usesJni() == !off, "usesJni " + client.usesJni() + " with cc.appserver.jni=" + System.getProperty("cc.appserver.jni"));
            check(client.threadList().getThreads().isEmpty(), "a request answers");
        }
        if (System.getProperty("jna.library.path") == null) {
            String lib = System.getProperty("uniffi.component.cc_app_server.libraryOverride");
            check(lib != null && new java.io.File(lib).isFile(), "the library copied out of the jar: " + lib);
            java.io.File dir = new java.io.File(lib).getParentFile();
            if (!System.getProperty("os.name").startsWith("Windows")) {
                java.util.Set<java.nio.file.attribute.PosixFilePermission> perms =
                    java.nio.file.Files.getPosixFilePermissions(dir.toPath());
                check(perms.equals(java.nio.file.attribute.PosixFilePermissions.fromString("rwx------")), "private dir " + perms);
            }
        }
    }

    @Test
    public void blockingFuturesApprovalsAndSubscription() throws Exception {
        AtomicInteger asked = new AtomicInteger();
        try (JavaAppServer server = JavaAppServer.open(stateDir(), new ServerOptions().withWorkspace("/repo"));
             JavaClient client = server.client(request -> {
                 asked.incrementAndGet();
                 check(request.getTool().equals("fs.write"), "tool " + request.getTool());
                 // The published ApprovalRequest: its id names the nonce; it says how risky.
                 check(request.getId().equals("approval-" + request.getBinding().getNonce()), "id " + request.getId());
                 check(request.getRisk() != null && request.getPublished().getOperation().getTool().equals("fs.write"),
                     "risk " + request.getRisk());
                 return Decision.acceptOnce();
             })) {
            List<ServerNotification> seen = new CopyOnWriteArrayList<>();
            CountDownLatch completed = new CountDownLatch(1);
            AutoCloseable subscription = client.subscribe(n -> {
                seen.add(n);
                if (n instanceof ServerNotification.TurnCompleted) completed.countDown();
            });
            try {
                String threadId = client.threadStart("from java").getThread().getId();
                client.request("thread/list", "{}");
                // agentOptions through the escape hatch: the facade takes JSON text as well.
                client.request("thread/start", "{\"threadId\":\"j\",\"agentOptions\":{\"script\":" + TOOL_SCRIPT + "}}");
                CompletableFuture<String> turn =
                    client.turnStartAsync("j", "go").thenApply(r -> r.getTurn().getId());
                String turnId = turn.get(30, TimeUnit.SECONDS);
                check(completed.await(30, TimeUnit.SECONDS), "no turn/completed");
                check(threadId.startsWith("thr_") || !threadId.isEmpty(), "thread id " + threadId);
                ServerNotification.TurnCompleted done = (ServerNotification.TurnCompleted) seen.stream()
                    .filter(n -> n instanceof ServerNotification.TurnCompleted).findFirst().orElseThrow();
                check(done.getValue().getParams().getTurn().getId().equals(turnId), "turn id");
                check(done.getValue().getParams().getTurn().getStatus() == TurnStatus.Completed, "status");
                check(done.getValue().getParams().getError() == null, "no error beside a completed turn");
                check(done.getValue().getParams().getTurn().getTerminalEvidence() != null, "terminal evidence");
                check(seen.stream().anyMatch(n -> n instanceof ServerNotification.ApprovalResolved
                    && ((ServerNotification.ApprovalResolved) n).getValue().getParams().getOutcome() == ApprovalOutcome.Approved),
                    "approval approved");
            } finally {
                subscription.close();
            }
            check(asked.get() == 1, "asked " + asked.get());
            check(server.stats().getToolsExecuted() == 1L, "tools executed");
            check(client.threadList().getThreads().size() == 2, "two threads");
        }
    }

    @Test
    public void typedExceptionsAndTimeouts() throws Exception {
        try (JavaAppServer server = JavaAppServer.open(stateDir());
             JavaClient client = server.client()) {
            try {
                client.threadRead("missing");
                throw new AssertionError("no exception");
            } catch (ProtocolException e) {
                check(e.getCode() == -32004, "code " + e.getCode());
            }
            try {
                client.requestAsync("thread/read", "{\"threadId\":\"missing\"}").get();
                throw new AssertionError("no exception");
            } catch (ExecutionException e) {
                check(e.getCause() instanceof ProtocolException, "cause " + e.getCause());
            }
            check(client.nextNotification(10L) == null, "idle is null");
            JavaClient closed = server.client();
            closed.close();
            check(closed.isClosed(), "closed");
            try {
                closed.nextNotification(10L);
                throw new AssertionError("no exception");
            } catch (AppServerException.Closed e) {
                check(e.getCode() == -32603, "closed code");
            }
        }
    }

    @Test
    public void aThrowingApprovalCallbackDeclines() throws Exception {
        try (JavaAppServer server = JavaAppServer.open(stateDir());
             JavaClient client = server.client(request -> {
                 throw new IllegalStateException("java handler bug");
             })) {
            client.request("thread/start", "{\"threadId\":\"d\",\"agentOptions\":{\"script\":" + TOOL_SCRIPT + "}}");
            client.turnStart("d", "go");
            ApprovalOutcome outcome = null;
            String denied = null;
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while ((outcome == null || denied == null) && System.nanoTime() < deadline) {
                ServerNotification n = client.nextNotification(100L);
                if (n instanceof ServerNotification.ApprovalResolved) {
                    outcome = ((ServerNotification.ApprovalResolved) n).getValue().getParams().getOutcome();
                }
                if (n instanceof ServerNotification.ToolResult
                    && ((ServerNotification.ToolResult) n).getValue().getParams().getResult() instanceof ToolResult.Denied) {
                    denied = ((ToolResult.Denied) ((ServerNotification.ToolResult) n).getValue().getParams().getResult())
                        .getValue().getReason();
                }
            }
            check(outcome == ApprovalOutcome.Declined, "outcome " + outcome);
            // The decline says why, and the denied tool result carries it.
            check(denied != null && denied.startsWith("approval declined: the approval handler failed")
                && denied.contains("java handler bug"), "denied " + denied);
            check(server.stats().getToolsExecuted() == 0L, "no tool ran");
        }
    }

    /** For the plain-classpath run: every test, in order; exit 1 if any failed. */
    public static void main(String[] args) throws Exception {
        PlainRun.run("java-facade", new JavaFacadeTest(), "theJniHotPathIsOnUnlessTurnedOff", "blockingFuturesApprovalsAndSubscription", "typedExceptionsAndTimeouts", "aThrowingApprovalCallbackDeclines");
    }

}
