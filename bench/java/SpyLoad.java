import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Level;
import java.util.logging.Logger;

import net.spy.memcached.AddrUtil;
import net.spy.memcached.BinaryConnectionFactory;
import net.spy.memcached.ConnectionFactory;
import net.spy.memcached.DefaultConnectionFactory;
import net.spy.memcached.MemcachedClient;

/**
 * A Java service's load on one memcached address: one spymemcached client (one connection,
 * which pipelines every thread's operations), THREADS threads each setting one of its own keys
 * and getting it back, for WARMUP then SECONDS seconds. Only operations started after the
 * warm-up count. Prints one line of key=value pairs for bench/spymemcached.sh:
 * ops_per_s (a set and a get are two operations), get_p50_us, get_p99_us (100000 means 100 ms or
 * more), errors (an exception or a set not stored) and wrong (a get that did not return the value
 * its thread had just set).
 *
 * Usage: java SpyLoad HOST:PORT text|binary THREADS SECONDS WARMUP VALUE_BYTES
 */
public final class SpyLoad {
    // Held so that the level set on it stays: java.util.logging keeps loggers weakly.
    private static final Logger SPY_LOG = Logger.getLogger("net.spy.memcached");

    private static final int MAX_US = 100_000; // latencies above go to the last bucket
    private static final int KEYS_PER_THREAD = 1000;
    private static final AtomicLong shown = new AtomicLong(); // errors and wrong answers printed

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: SpyLoad HOST:PORT text|binary THREADS SECONDS WARMUP VALUE_BYTES");
            System.exit(2);
        }
        String addr = args[0];
        ConnectionFactory factory = switch (args[1]) {
            case "text" -> new DefaultConnectionFactory();
            case "binary" -> new BinaryConnectionFactory();
            default -> throw new IllegalArgumentException("protocol " + args[1] + " is not text or binary");
        };
        int threads = Integer.parseInt(args[2]);
        double seconds = Double.parseDouble(args[3]);
        double warmup = Double.parseDouble(args[4]);
        int valueBytes = Integer.parseInt(args[5]);

        // spymemcached logs every connect at INFO on stderr by default; keep warnings only.
        System.setProperty("net.spy.log.LoggerImpl", "net.spy.memcached.compat.log.SunLogger");
        SPY_LOG.setLevel(Level.WARNING);

        MemcachedClient client = new MemcachedClient(factory, AddrUtil.getAddresses(addr));
        long start = System.nanoTime();
        long measureFrom = start + (long) (warmup * 1e9);
        long until = measureFrom + (long) (seconds * 1e9);
        Worker[] workers = new Worker[threads];
        for (int t = 0; t < threads; t++) {
            workers[t] = new Worker(client, t, valueBytes, measureFrom, until);
            workers[t].start();
        }
        long ops = 0, errors = 0, wrong = 0;
        long[] hist = new long[MAX_US + 1];
        for (Worker w : workers) {
            // Each operation is bounded by the client's 2.5 s operation timeout.
            w.join((long) ((warmup + seconds) * 1000) + 30_000);
            if (w.isAlive()) {
                throw new IllegalStateException("worker " + w.getName() + " did not stop");
            }
            ops += w.ops;
            errors += w.errors;
            wrong += w.wrong;
            for (int i = 0; i <= MAX_US; i++) {
                hist[i] += w.getUs[i];
            }
        }
        client.shutdown(5, TimeUnit.SECONDS);
        System.out.printf("ops_per_s=%.0f get_p50_us=%d get_p99_us=%d ops=%d errors=%d wrong=%d%n",
                ops / seconds, percentile(hist, 0.50), percentile(hist, 0.99), ops, errors, wrong);
    }

    private static long percentile(long[] hist, double p) {
        long total = 0;
        for (long n : hist) {
            total += n;
        }
        long rank = (long) Math.ceil(p * total), seen = 0;
        for (int us = 0; us < hist.length; us++) {
            seen += hist[us];
            if (seen >= rank && seen > 0) {
                return us;
            }
        }
        return -1;
    }

    /** Prints the first few errors and wrong answers on stderr. */
    private static void show(String what) {
        if (shown.incrementAndGet() <= 5) {
            System.err.println("SpyLoad: " + what);
        }
    }

    /** One thread's set-then-get loop over its own keys; its counters are read after join. */
    private static final class Worker extends Thread {
        private final MemcachedClient client;
        private final int id;
        private final String padding;
        private final long measureFrom, until;
        long ops, errors, wrong;
        final long[] getUs = new long[MAX_US + 1];

        Worker(MemcachedClient client, int id, int valueBytes, long measureFrom, long until) {
            super("load-" + id);
            this.client = client;
            this.id = id;
            this.padding = "x".repeat(valueBytes);
            this.measureFrom = measureFrom;
            this.until = until;
        }

        @Override
        public void run() {
            for (long i = 0; ; i++) {
                long begin = System.nanoTime();
                if (begin >= until) {
                    return;
                }
                boolean counted = begin >= measureFrom;
                String key = "spy:" + id + ":" + (i % KEYS_PER_THREAD);
                String prefix = id + ":" + i + ":";
                String value = prefix + padding.substring(Math.min(prefix.length(), padding.length()));
                // The set is not awaited before the get: like a service that writes then reads,
                // it relies on the connection keeping its requests in order.
                Future<Boolean> set = client.set(key, 0, value);
                Object got;
                long getStart = System.nanoTime();
                try {
                    got = client.get(key);
                } catch (RuntimeException e) {
                    show("get " + key + ": " + e);
                    if (counted) errors++;
                    continue;
                }
                long getNs = System.nanoTime() - getStart;
                boolean stored;
                try {
                    stored = set.get(5, TimeUnit.SECONDS);
                } catch (Exception e) {
                    show("set " + key + ": " + e);
                    if (counted) errors++;
                    continue;
                }
                if (!counted) {
                    continue;
                }
                ops += 2;
                getUs[(int) Math.min(getNs / 1000, MAX_US)]++;
                if (!stored) {
                    errors++;
                    show("set " + key + ": not stored");
                } else if (!value.equals(got)) {
                    wrong++;
                    show("wrong answer for " + key + ": got " + got + ", want " + value);
                }
            }
        }
    }
}
