package com.chainlesschain.appserver;

import java.lang.reflect.InvocationTargetException;

/**
 * The Java tests' runner for the plain-classpath runs of scripts/test-jvm.sh (no JUnit there):
 * invokes each named test method in order, prints `ok`/`FAILED` per test and the
 * `LABEL: N passed, M failed` line CI reads, and exits 1 if any failed.
 */
final class PlainRun {
    private PlainRun() {}

    static void check(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    static void run(String label, Object test, String... names) throws Exception {
        int passed = 0;
        int failed = 0;
        for (String name : names) {
            try {
                test.getClass().getMethod(name).invoke(test);
                passed++;
                System.out.println("ok " + name);
            } catch (InvocationTargetException e) {
                failed++;
                System.out.println("FAILED " + name + ": " + e.getCause());
                e.getCause().printStackTrace();
            }
        }
        System.out.println(label + ": " + passed + " passed, " + failed + " failed");
        System.exit(failed == 0 ? 0 : 1);
    }
}
