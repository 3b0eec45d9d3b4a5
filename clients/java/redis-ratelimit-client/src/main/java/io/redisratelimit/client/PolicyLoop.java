package io.redisratelimit.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * A policy's protection loop, the words {@code RL.POLICY SET} takes after
 * the spec: {@code ADAPT ERRORS pct [FACTOR f] [MIN m] [RECOVER r]
 * [MINCALLS n]}, {@code STAGES degrade_pct break_pct} and {@code WINDOW ms}.
 * Immutable; each argument is checked here, refused naming it as the
 * server's error does ({@code ERRORS}, {@code FACTOR}, {@code degrade_pct},
 * ...).
 *
 * <pre>{@code
 * PolicyLoop loop = PolicyLoop.adapt(5).minCalls(20).stages(30, 50).window(Duration.ofSeconds(1));
 * client.policySet("orders", spec, PolicyMode.ENFORCE, 100, loop);
 * }</pre>
 */
public final class PolicyLoop {
    /** {@code FACTOR}'s default: the scale is multiplied by 80 % on a window over the error threshold. */
    public static final int DEFAULT_FACTOR = 80;
    /** {@code MIN}'s default: the scale never falls below 50 %. */
    public static final int DEFAULT_MIN = 50;
    /** {@code RECOVER}'s default: 5 points back per window at most half the threshold. */
    public static final int DEFAULT_RECOVER = 5;
    /** {@code MINCALLS}'s default: a window with fewer outcomes changes nothing. */
    public static final long DEFAULT_MIN_CALLS = 100;
    /** The window's default on the server ({@code WINDOW} not sent). */
    public static final long DEFAULT_WINDOW_MS = 10_000;
    /** The largest {@code WINDOW}: one day. */
    public static final long MAX_WINDOW_MS = 86_400_000;

    /** No loop: a plain policy. */
    public static final PolicyLoop NONE = new PolicyLoop(-1, DEFAULT_FACTOR, DEFAULT_MIN, DEFAULT_RECOVER, DEFAULT_MIN_CALLS, false, -1, -1, 0);

    private final int errorsPct;
    private final int factor;
    private final int min;
    private final int recover;
    private final long minCalls;
    private final boolean adaptOff;
    private final int degradePct;
    private final int breakPct;
    private final long windowMs;

    private PolicyLoop(int errorsPct, int factor, int min, int recover, long minCalls, boolean adaptOff, int degradePct,
                       int breakPct, long windowMs) {
        this.errorsPct = errorsPct;
        this.factor = factor;
        this.min = min;
        this.recover = recover;
        this.minCalls = minCalls;
        this.adaptOff = adaptOff;
        this.degradePct = degradePct;
        this.breakPct = breakPct;
        this.windowMs = windowMs;
    }

    /** {@code ADAPT ERRORS pct}: the scale falls when a window's errors exceed {@code pct} % of its outcomes. */
    public static PolicyLoop adapt(int errorsPct) {
        return NONE.withAdapt(errorsPct);
    }

    /** {@code STAGES degrade_pct break_pct} without adapting. */
    public static PolicyLoop staged(int degradePct, int breakPct) {
        return NONE.stages(degradePct, breakPct);
    }

    /** {@code ADAPT OFF}: stop adapting and keep the current scale. */
    public static PolicyLoop adaptOff() {
        return new PolicyLoop(-1, DEFAULT_FACTOR, DEFAULT_MIN, DEFAULT_RECOVER, DEFAULT_MIN_CALLS, true, -1, -1, 0);
    }

    public PolicyLoop withAdapt(int pct) {
        return new PolicyLoop(range("ERRORS", pct, 0, 100), factor, min, recover, minCalls, false, degradePct, breakPct, windowMs);
    }

    public PolicyLoop factor(int f) {
        return new PolicyLoop(errorsPct, range("FACTOR", f, 1, 100), min, recover, minCalls, adaptOff, degradePct, breakPct, windowMs);
    }

    public PolicyLoop min(int m) {
        return new PolicyLoop(errorsPct, factor, range("MIN", m, 1, 100), recover, minCalls, adaptOff, degradePct, breakPct, windowMs);
    }

    public PolicyLoop recover(int r) {
        return new PolicyLoop(errorsPct, factor, min, range("RECOVER", r, 0, 100), minCalls, adaptOff, degradePct, breakPct, windowMs);
    }

    public PolicyLoop minCalls(long n) {
        return new PolicyLoop(errorsPct, factor, min, recover, range("MINCALLS", n, 0, Spec.MAX_PARAM), adaptOff, degradePct, breakPct, windowMs);
    }

    public PolicyLoop stages(int degrade, int brk) {
        range("degrade_pct", degrade, 0, 100);
        range("break_pct", brk, degrade, 100);
        return new PolicyLoop(errorsPct, factor, min, recover, minCalls, adaptOff, degrade, brk, windowMs);
    }

    public PolicyLoop window(Duration window) {
        long ms = window == null ? 0 : window.toMillis();
        return new PolicyLoop(errorsPct, factor, min, recover, minCalls, adaptOff, degradePct, breakPct, range("WINDOW", ms, 1, MAX_WINDOW_MS));
    }

    private static long range(String name, long v, long lo, long hi) {
        if (v < lo || v > hi) {
            throw new InvalidArgumentException(name, "must be an integer from " + lo + " to " + hi + ", got " + v);
        }
        return v;
    }

    private static int range(String name, int v, int lo, int hi) {
        return (int) range(name, (long) v, lo, hi);
    }

    /** Whether {@code ADAPT ERRORS} is set. */
    public boolean adapting() {
        return errorsPct >= 0;
    }

    /** Whether {@code STAGES} is set. */
    public boolean staged() {
        return degradePct >= 0;
    }

    /** Whether the policy has a loop at all (adapt or stages). */
    public boolean any() {
        return adapting() || staged();
    }

    public int errorsPct() {
        return errorsPct;
    }

    public int degradePct() {
        return degradePct;
    }

    public int breakPct() {
        return breakPct;
    }

    /** The window in ms, 0 when the server's default applies. */
    public long windowMs() {
        return windowMs;
    }

    /** The words after the spec, the mode and the roll-out of {@code RL.POLICY SET}. */
    public List<String> words() {
        List<String> w = new ArrayList<>();
        if (adapting()) {
            w.addAll(List.of("ADAPT", "ERRORS", Integer.toString(errorsPct), "FACTOR", Integer.toString(factor), "MIN",
                    Integer.toString(min), "RECOVER", Integer.toString(recover), "MINCALLS", Long.toString(minCalls)));
        } else if (adaptOff) {
            w.addAll(List.of("ADAPT", "OFF"));
        }
        if (staged()) {
            w.addAll(List.of("STAGES", Integer.toString(degradePct), Integer.toString(breakPct)));
        }
        if (windowMs > 0) {
            w.addAll(List.of("WINDOW", Long.toString(windowMs)));
        }
        return w;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof PolicyLoop l && l.words().equals(words());
    }

    @Override
    public int hashCode() {
        return words().hashCode();
    }

    @Override
    public String toString() {
        return words().isEmpty() ? "(no loop)" : String.join(" ", words());
    }
}
