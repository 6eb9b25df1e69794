// SpyAuth runs memccapable-style checks with spymemcached (Debian's libspymemcached-java)
// over the binary protocol, authenticated with SASL PLAIN, against one server:
//
//	java -cp spymemcached.jar:<dir of SpyAuth.class> SpyAuth host:port user password [mechs]
//
// mechs, the SASL mechanisms offered, comma-separated, is PLAIN when not given: what
// memcached -S with "mech_list: plain" accepts, and moxi. AuthDescriptor.typical, what
// spymemcached's documentation shows, offers CRAM-MD5,PLAIN, and Java's SASL client takes
// the first it supports, CRAM-MD5, whatever the server listed: against a server that does
// PLAIN only it never authenticates. mechs "typical" uses AuthDescriptor.typical.
//
// Each check prints "ok <name>" or "FAIL <name>: <why>". Exit codes: 0 every check passed,
// 1 a check failed (or the whole run overran its wall-clock limit), 2 authentication did
// not succeed ("auth failed", see below), 3 bad arguments. test/authclients_test.go
// compiles and runs it (runSpymemcached).
//
// spymemcached retries a failed authentication for ever (it drops the connection and
// reconnects, every 2 s or so), and an operation on a node not authenticated waits for it:
// the program therefore waits for the node to be authenticated itself before any check,
// and gives up ("auth failed", exit 2) as soon as a connection is lost before
// authenticating (what a rejected password does), or after AUTH_LIMIT_MS (a server that
// never answers). A watchdog ends the whole run after RUN_LIMIT_MS.
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.TimeUnit;

import net.spy.memcached.AddrUtil;
import net.spy.memcached.CASResponse;
import net.spy.memcached.CASValue;
import net.spy.memcached.ConnectionFactory;
import net.spy.memcached.ConnectionFactoryBuilder;
import net.spy.memcached.ConnectionObserver;
import net.spy.memcached.MemcachedClient;
import net.spy.memcached.MemcachedNode;
import net.spy.memcached.auth.AuthDescriptor;
import net.spy.memcached.auth.PlainCallbackHandler;

public class SpyAuth {
    static final long AUTH_LIMIT_MS = 10_000;
    static final long RUN_LIMIT_MS = 50_000;
    static final long OP_TIMEOUT_MS = 5_000;

    // Client can tell whether its nodes have authenticated: getNodeLocator() gives
    // read-only nodes, whose isAuthenticated throws; the connection's locator has the nodes.
    static class Client extends MemcachedClient {
        Client(ConnectionFactory cf, List<InetSocketAddress> addrs) throws IOException {
            super(cf, addrs);
        }

        boolean authenticated() {
            for (MemcachedNode n : mconn.getLocator().getAll()) {
                if (!n.isAuthenticated()) {
                    return false;
                }
            }
            return true;
        }
    }

    interface Check {
        // Returns null when the check passed, else why it failed.
        String run() throws Exception;
    }

    static int failed = 0;
    static volatile boolean authDone, lostBeforeAuth;

    static void check(String name, Check c) {
        String why;
        try {
            why = c.run();
        } catch (Exception e) {
            why = e.toString();
        }
        if (why == null) {
            System.out.println("ok " + name);
        } else {
            failed++;
            System.out.println("FAIL " + name + ": " + why);
        }
        System.out.flush();
    }

    static String expect(String what, Object got, Object want) {
        if (want == null ? got == null : want.equals(got)) {
            return null;
        }
        return what + ": got " + got + ", want " + want;
    }

    // first is the first failure of several expectations, or null.
    static String first(String... whys) {
        for (String w : whys) {
            if (w != null) {
                return w;
            }
        }
        return null;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3 && args.length != 4) {
            System.err.println("usage: SpyAuth host:port user password [mechs|typical]");
            System.exit(3);
        }
        final long start = System.nanoTime();
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(RUN_LIMIT_MS);
            } catch (InterruptedException e) {
                return;
            }
            System.out.println("FAIL run: not finished after " + RUN_LIMIT_MS + " ms");
            System.out.flush();
            Runtime.getRuntime().halt(1);
        });
        watchdog.setDaemon(true);
        watchdog.start();

        String mechs = args.length == 4 ? args[3] : "PLAIN";
        AuthDescriptor auth = mechs.equals("typical")
                ? AuthDescriptor.typical(args[1], args[2])
                : new AuthDescriptor(mechs.split(","), new PlainCallbackHandler(args[1], args[2]));
        List<InetSocketAddress> addrs = AddrUtil.getAddresses(args[0]);
        Client c = new Client(new ConnectionFactoryBuilder()
                .setProtocol(ConnectionFactoryBuilder.Protocol.BINARY)
                .setAuthDescriptor(auth)
                .setOpTimeout(OP_TIMEOUT_MS)
                .setDaemon(true)
                .setInitialObservers(Collections.singleton(new ConnectionObserver() {
                    public void connectionEstablished(SocketAddress sa, int reconnects) {
                    }

                    public void connectionLost(SocketAddress sa) {
                        lostBeforeAuth = lostBeforeAuth || !authDone;
                    }
                }))
                .build(), addrs);

        // Wait, bounded, until every node has authenticated.
        long authDeadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(AUTH_LIMIT_MS);
        for (;;) {
            if (c.authenticated()) {
                authDone = true;
                break;
            }
            String why = null;
            if (lostBeforeAuth) {
                why = "the connection was lost before authenticating (credentials refused?)";
            } else if (System.nanoTime() > authDeadline) {
                why = "did not succeed within " + AUTH_LIMIT_MS + " ms";
            }
            if (why != null) {
                System.out.println("auth failed: SASL " + mechs + " as " + args[1] + " to " + args[0]
                        + ": " + why + ", after "
                        + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) + " ms");
                System.out.flush();
                Runtime.getRuntime().halt(2); // shutdown could wait on the auth thread
            }
            Thread.sleep(20);
        }
        System.out.println("authenticated in "
                + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) + " ms");

        Random rnd = new Random();
        final String p = "spyauth:" + Long.toHexString(System.currentTimeMillis())
                + Integer.toHexString(rnd.nextInt()) + ":";

        check("set/get", () -> first(
                expect("set", c.set(p + "sg", 0, "hello").get(), true),
                expect("get", c.get(p + "sg"), "hello"),
                expect("get missing", c.get(p + "missing"), null)));

        check("add new key", () -> first(
                expect("add", c.add(p + "add", 0, "first").get(), true),
                expect("get", c.get(p + "add"), "first")));
        check("add existing key", () -> first(
                expect("add", c.add(p + "add", 0, "second").get(), false),
                expect("get", c.get(p + "add"), "first")));

        check("replace missing key", () -> first(
                expect("replace", c.replace(p + "repl", 0, "x").get(), false),
                expect("get", c.get(p + "repl"), null)));
        check("replace existing key", () -> first(
                expect("set", c.set(p + "repl", 0, "old").get(), true),
                expect("replace", c.replace(p + "repl", 0, "new").get(), true),
                expect("get", c.get(p + "repl"), "new")));

        check("delete", () -> first(
                expect("set", c.set(p + "del", 0, "x").get(), true),
                expect("delete", c.delete(p + "del").get(), true),
                expect("get", c.get(p + "del"), null),
                expect("delete again", c.delete(p + "del").get(), false)));

        check("incr/decr with default", () -> first(
                expect("incr creates", c.incr(p + "ctr", 5, 10), 10L),
                expect("incr", c.incr(p + "ctr", 5, 10), 15L),
                expect("decr", c.decr(p + "ctr", 3, 10), 12L),
                expect("decr below zero", c.decr(p + "ctr", 100, 10), 0L),
                expect("decr creates", c.decr(p + "ctr2", 1, 7), 7L),
                expect("incr missing, no default", c.incr(p + "ctr3", 1), -1L)));

        check("append/prepend", () -> first(
                expect("set", c.set(p + "ap", 0, "mid").get(), true),
                expect("append", c.append(p + "ap", "-end").get(), true),
                expect("prepend", c.prepend(p + "ap", "start-").get(), true),
                expect("get", c.get(p + "ap"), "start-mid-end"),
                expect("append missing", c.append(p + "apmissing", "x").get(), false)));

        check("cas", () -> {
            String why = expect("set", c.set(p + "cas", 0, "v1").get(), true);
            if (why != null) {
                return why;
            }
            CASValue<Object> v = c.gets(p + "cas");
            if (v == null) {
                return "gets: no value";
            }
            return first(
                    expect("gets value", v.getValue(), "v1"),
                    expect("cas", c.cas(p + "cas", v.getCas(), "v2"), CASResponse.OK),
                    expect("get", c.get(p + "cas"), "v2"),
                    expect("cas stale", c.cas(p + "cas", v.getCas(), "v3"), CASResponse.EXISTS),
                    expect("get after stale cas", c.get(p + "cas"), "v2"),
                    expect("cas missing", c.cas(p + "casmissing", 1, "x"), CASResponse.NOT_FOUND));
        });

        check("touch", () -> first(
                expect("set", c.set(p + "touch", 0, "t").get(), true),
                expect("touch", c.touch(p + "touch", 3600).get(), true),
                expect("get", c.get(p + "touch"), "t"),
                expect("touch missing", c.touch(p + "touchmissing", 3600).get(), false)));

        check("bulk get of 100 keys", () -> {
            List<String> keys = new ArrayList<>();
            for (int i = 0; i < 100; i++) {
                String k = p + "bulk" + i;
                keys.add(k);
                if (!c.set(k, 0, "value" + i).get()) {
                    return "set " + k + " failed";
                }
            }
            List<String> ask = new ArrayList<>(keys);
            ask.add(p + "bulkmissing");
            Collections.shuffle(ask, rnd);
            Map<String, Object> got = c.getBulk(ask);
            if (got.size() != 100) {
                return "got " + got.size() + " keys, want 100";
            }
            for (int i = 0; i < 100; i++) {
                String why = expect(keys.get(i), got.get(keys.get(i)), "value" + i);
                if (why != null) {
                    return why;
                }
            }
            return null;
        });

        check("512 KB value", () -> {
            byte[] big = new byte[512 * 1024];
            rnd.nextBytes(big); // random: the transcoder does not compress it
            String why = expect("set", c.set(p + "big", 0, big).get(), true);
            if (why != null) {
                return why;
            }
            Object got = c.get(p + "big");
            if (!(got instanceof byte[])) {
                return "get: got " + (got == null ? "null" : got.getClass().getName());
            }
            if (!Arrays.equals((byte[]) got, big)) {
                return "get: " + ((byte[]) got).length + " bytes that differ from the "
                        + big.length + " set";
            }
            return null;
        });

        check("utf-8 value", () -> {
            String v = "h\u00e9llo w\u00f6rld \u2713"; // escapes: javac's source encoding is the locale's
            return first(
                    expect("set", c.set(p + "utf8", 0, v).get(), true),
                    expect("get", c.get(p + "utf8"), v));
        });

        c.shutdown(2, TimeUnit.SECONDS);
        System.out.println((failed == 0 ? "PASS" : "FAIL") + ": " + failed + " failed, in "
                + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) + " ms");
        System.out.flush();
        Runtime.getRuntime().halt(failed == 0 ? 0 : 1);
    }
}
