// Every error class of the SDK (docs/kotlin.md, "Errors"), each made to happen for real and caught
// by its class from Java: a missing thread, a busy thread, bad params, too many requests, a late
// answer, a closed client, a locked / unsafe / damaged store, a failing kernel, an interrupted turn.
// Runs under JUnit (mvn verify) and, through main(), from the built jar on a plain classpath.
package com.chainlesschain.appserver;

import com.chainlesschain.appserver.protocol.AgentOptions;
import com.chainlesschain.appserver.protocol.DecodeMode;
import com.chainlesschain.appserver.protocol.ServerNotification;
import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.json.JSONObject;
import org.junit.jupiter.api.Test;

public class ErrorClassesTest {
    private static void check(boolean ok, String what) {
        PlainRun.check(ok, what);
    }

    private static Path tempDir() throws Exception {
        Path dir = Files.createTempDirectory("cc-java-errors");
        Runtime.getRuntime().addShutdownHook(new Thread(() -> deleteTree(dir.toFile())));
        return dir;
    }

    private static void deleteTree(File f) {
        File[] children = f.listFiles();
        if (children != null) {
            for (File c : children) deleteTree(c);
        }
        f.delete();
    }

    private static AgentOptions script(String steps) {
        return AgentOptions.Companion.fromJson(new JSONObject("{\"script\":{\"steps\":[" + steps + "]}}"), DecodeMode.Receive);
    }

    /** Runs [body] and returns what it threw, failing when it threw nothing or something else. */
    private static <T extends Throwable> T expect(Class<T> type, ThrowingRunnable body) {
        try {
            body.run();
        } catch (Throwable e) {
            Throwable t = e instanceof java.util.concurrent.ExecutionException ? e.getCause() : e;
            if (type.isInstance(t)) return type.cast(t);
            throw new AssertionError("expected " + type.getSimpleName() + ", got " + t, t);
        }
        throw new AssertionError("expected " + type.getSimpleName() + ", nothing thrown");
    }

    interface ThrowingRunnable {
        void run() throws Exception;
    }

    @Test
    public void protocolClasses() throws Exception {
        try (JavaAppServer server = JavaAppServer.open(tempDir().resolve("state"));
             JavaClient client = server.client()) {
            AppServerException.NotFound missing = expect(AppServerException.NotFound.class, () -> client.threadRead("missing"));
            check(missing.getCode() == -32004, "not found code " + missing.getCode());
            check(missing instanceof ProtocolException, "NotFound is a ProtocolException");
            // The store's own NotFound is the same class.
            expect(AppServerException.NotFound.class, () -> server.store().read("missing", 0, 10));

            AppServerException.InvalidParams bad = expect(AppServerException.InvalidParams.class, () -> client.threadStart(null, "../etc"));
            check(bad.getCode() == -32602 && bad instanceof ProtocolException, "invalid params " + bad.getCode());

            // A second turn on a busy thread.
            client.threadStart(null, "busy", script("{\"type\":\"sleep\",\"ms\":3000}"), null);
            String first = client.turnStart("busy", "one").getTurn().getId();
            AppServerException.Conflict busy = expect(AppServerException.Conflict.class, () -> client.turnStart("busy", "two"));
            check(busy.getCode() == -32009 && busy instanceof ProtocolException, "conflict " + busy.getCode());
            client.turnInterrupt("busy", first);

            // The async form fails with the same class, as the future's cause.
            expect(AppServerException.NotFound.class, () -> client.threadReadAsync("missing").get(30, TimeUnit.SECONDS));
        }
    }

    @Test
    public void overloadedTimeoutAndClosed() throws Exception {
        ServerOptions options = ServerOptions.builder().settleDeadlineMs(5_000L).build();
        try (JavaAppServer server = JavaAppServer.open(tempDir().resolve("state"), options);
             JavaClient client = server.client(null, new ClientOptions().withMaxPending(1).withRequestTimeoutMs(500L))) {
            // A kernel that ignores the interrupt for a while keeps turn/interrupt unanswered.
            client.threadStart(null, "slow", script("{\"type\":\"message\",\"text\":\"in\"},{\"type\":\"ignoreCancel\",\"ms\":2500}"), null);
            JavaTurnHandle turn = client.turn("slow", "go");
            // The kernel is running (its message is out) before the interrupt: a turn still
            // waiting for a runner would settle at once, and nothing would stay pending.
            for (ServerNotification n : turn) {
                if (n instanceof ServerNotification.ItemCompleted) break;
            }
            CompletableFuture<?> interrupt = client.turnInterruptAsync("slow", turn.turnId());
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (client.getPendingRequests() < 1 && System.nanoTime() < deadline) Thread.sleep(5);
            AppServerException.Overloaded overloaded = expect(AppServerException.Overloaded.class, client::threadList);
            check(overloaded.getCode() == -32001 && overloaded.getRetryAfterMs() >= 1, "overloaded " + overloaded.getRetryAfterMs());
            AppServerException.Timeout late = expect(AppServerException.Timeout.class, () -> interrupt.get(30, TimeUnit.SECONDS));
            check(late.getCode() == -32010, "timeout code " + late.getCode());
            turn.close();
        }
        try (JavaAppServer server = JavaAppServer.open(tempDir().resolve("state"))) {
            JavaClient client = server.client();
            client.close();
            AppServerException.Closed closed = expect(AppServerException.Closed.class, client::threadList);
            check(closed.getCode() == -32603, "closed code " + closed.getCode());
        }
    }

    @Test
    public void storeClasses() throws Exception {
        Path dir = tempDir().resolve("state");
        try (JavaAppServer server = JavaAppServer.open(dir)) {
            AppServerException.StoreLocked locked = expect(AppServerException.StoreLocked.class, () -> JavaAppServer.open(dir));
            check(locked instanceof AppServerException.Store && locked.getCode() == -32603, "locked " + locked.getCode());
            expect(AppServerException.StoreLocked.class, () -> RolloutStore.open(dir));
            check(server.stats().getToolsExecuted() == 0L, "the first server still works");
        }

        Path open = tempDir().resolve("open");
        Files.createDirectories(open);
        Files.setPosixFilePermissions(open, PosixFilePermissions.fromString("rwxrwxrwx"));
        AppServerException.StoreUnsafe unsafe = expect(AppServerException.StoreUnsafe.class, () -> JavaAppServer.open(open));
        check(unsafe instanceof AppServerException.Store && unsafe.getCode() == -32603, "unsafe " + unsafe.getCode());
        Path file = tempDir().resolve("file");
        Files.writeString(file, "not a directory");
        expect(AppServerException.StoreUnsafe.class, () -> JavaAppServer.open(file));

        // A tampered rollout file: the chain no longer checks out.
        Path damaged = tempDir().resolve("state");
        try (JavaAppServer server = JavaAppServer.open(damaged);
             JavaClient client = server.client()) {
            client.threadStart("to be tampered", "t");
        }
        Path log = findRollout(damaged.toFile(), "t");
        String text = Files.readString(log);
        check(text.contains("to be tampered"), "the log holds the title");
        Files.writeString(log, text.replace("to be tampered", "tampered after"));
        AppServerException.StoreDamaged bad = expect(AppServerException.StoreDamaged.class, () -> {
            try (RolloutStore store = RolloutStore.open(damaged)) {
                store.read("t", 0, 10);
            }
        });
        check(bad instanceof AppServerException.Store && bad.getCode() == -32603, "damaged " + bad.getCode());
    }

    private static Path findRollout(File dir, String threadId) {
        File[] children = dir.listFiles();
        if (children != null) {
            for (File c : children) {
                if (c.isDirectory()) {
                    Path p = findRollout(c, threadId);
                    if (p != null) return p;
                } else if (c.getName().startsWith(threadId) && c.getName().endsWith(".jsonl")) {
                    return c.toPath();
                }
            }
        }
        return null;
    }

    @Test
    public void turnClasses() throws Exception {
        try (JavaAppServer server = JavaAppServer.open(tempDir().resolve("state"));
             JavaClient client = server.client()) {
            client.threadStart(null, "f", script("{\"type\":\"message\",\"text\":\"before\"},{\"type\":\"fail\",\"message\":\"scripted failure\"}"), null);
            JavaTurnHandle failing = client.turn("f", "go");
            AppServerException.KernelFailed failed = expect(AppServerException.KernelFailed.class, failing::text);
            check(failed.getReason().equals("kernelFailed"), "reason " + failed.getReason());
            check(failed.getMessage().contains("scripted failure"), "message " + failed.getMessage());
            check(failed.getTurnId().equals(failing.turnId()) && failed.getCode() == -32603, "turn id, code");

            client.threadStart(null, "i", script("{\"type\":\"message\",\"text\":\"in\"},{\"type\":\"sleep\",\"ms\":20000}"), null);
            JavaTurnHandle sleeping = client.turn("i", "go");
            CompletableFuture<String> text = sleeping.textAsync();
            // Interrupt once the turn is running (its first message is in).
            Thread.sleep(200);
            client.turnInterrupt("i", sleeping.turnId());
            AppServerException.TurnInterrupted interrupted =
                expect(AppServerException.TurnInterrupted.class, () -> text.get(30, TimeUnit.SECONDS));
            check(interrupted.getTurnId().equals(sleeping.turnId()) && interrupted.getCode() == -32010, "interrupted");
        }
    }

    /** For the plain-classpath run: every test, in order. */
    public static void main(String[] args) throws Exception {
        PlainRun.run("error-classes", new ErrorClassesTest(), "protocolClasses", "overloadedTimeoutAndClosed", "storeClasses", "turnClasses");
    }
}
