// The testbed's RocketMQ client side (SPEC §12): the official Java client, run by testbed/rocketmq/record.py.
//
//   topics   --namesrv A --brokers ADDR,... --topic T:QUEUES ...     create each topic on every broker (DLedger does
//                                                                    not replicate topic configuration)
//   produce  --namesrv A --schedule FILE --out FILE --producer T:SEND_TIMEOUT_MS:RETRIES:POLL_MS:ORDERED ...
//            one DefaultMQProducer per policy, all in one MQClientInstance (one route poll schedule, the trace's
//            route_poll_phase_us); prints {"ev":"ready"} once every topic's route is known, reads the run's start
//            (epoch µs) from stdin, sends every scheduled message at its time (a synchronous send per message on
//            a pool thread, so that a slow send does not hold back the next), stops at the end of the schedule.
//            Writes one JSON line per send, per route request to the NameServer, per change of a producer's route
//            table, and per change of the NameServer's route (polled every 50 ms through the admin API).
//            With --ha ADDR,... (master/slave): each broker's HA state every 50 ms (GET_BROKER_HA_STATUS), one
//            line per change: a master's commit log max offset and each slave's acknowledged offset as the master
//            holds it, a slave's own commit log max offset.
//   read     --namesrv A --topic T ... --out FILE                     the verifying consumer: every queue of every
//                                                                    topic from offset 0 to its max offset
//
// Instants are wall-clock microseconds since the epoch (the recorder's clock).

import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.producer.TopicPublishInfo;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.selector.SelectMessageQueueByHash;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.remoting.protocol.RequestCode;
import org.apache.rocketmq.remoting.protocol.header.namesrv.GetRouteInfoRequestHeader;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.route.TopicRouteData;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

public final class ReplabHarness {
    static final String ID_PROPERTY = "replab_msg_id";
    /** Warm-up: how long every send must have been answered in time before the run starts, and "in time". */
    static final long WARM_STEADY_MS = 3_000;
    static final long WARM_SLOW_MS = 1_000;
    static PrintWriter out;

    static long nowUs() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1_000_000L + t.getNano() / 1000;
    }

    static synchronized void emit(String line) {
        out.println(line);
    }

    static String q(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static Map<String, List<String>> args(String[] argv) {
        Map<String, List<String>> m = new TreeMap<>();
        for (int i = 1; i + 1 < argv.length; i += 2) {
            m.computeIfAbsent(argv[i].replaceFirst("^--", ""), k -> new ArrayList<>()).add(argv[i + 1]);
        }
        return m;
    }

    public static void main(String[] argv) throws Exception {
        Map<String, List<String>> a = args(argv);
        out = new PrintWriter(new OutputStreamWriter(
            a.containsKey("out") ? new FileOutputStream(a.get("out").get(0)) : System.out, StandardCharsets.UTF_8),
            true);
        int rc;
        try {
            switch (argv[0]) {
                case "topics": rc = topics(a); break;
                case "produce": rc = produce(a); break;
                case "read": rc = read(a); break;
                case "route": rc = route(a); break;
                default: throw new IllegalArgumentException("unknown mode " + argv[0]);
            }
        } catch (Throwable e) {
            // The client's own threads would keep the JVM alive: exit, so that the recorder sees the failure.
            e.printStackTrace();
            rc = 2;
        }
        out.flush();
        System.exit(rc);
    }

    // ------------------------------------------------------------------------------------------------ topics
    static DefaultMQAdminExt admin(String namesrv, String name) throws MQClientException {
        DefaultMQAdminExt admin = new DefaultMQAdminExt(5000);
        admin.setNamesrvAddr(namesrv);
        admin.setInstanceName(name);
        admin.start();
        return admin;
    }

    static int topics(Map<String, List<String>> a) throws Exception {
        DefaultMQAdminExt admin = admin(a.get("namesrv").get(0), "replab-topics");
        try {
            for (String broker : a.get("brokers").get(0).split(",")) {
                for (String spec : a.get("topic")) {
                    String[] p = spec.split(":");
                    int queues = Integer.parseInt(p[1]);
                    admin.createAndUpdateTopicConfig(broker, new TopicConfig(p[0], queues, queues, 6));
                    emit("{\"ev\":\"topic\",\"topic\":" + q(p[0]) + ",\"broker\":" + q(broker) + "}");
                }
            }
        } finally {
            admin.shutdown();
        }
        return 0;
    }

    // ------------------------------------------------------------------------------------------------ produce
    static final class Send {
        long atUs;
        long msgId;
        int size;
        String key;
    }

    static String routeOf(TopicRouteData route) {
        if (route == null || route.getBrokerDatas() == null) {
            return "{}";
        }
        Map<String, Map<Long, String>> sorted = new TreeMap<>();
        for (BrokerData bd : route.getBrokerDatas()) {
            sorted.put(bd.getBrokerName(), new TreeMap<>(bd.getBrokerAddrs()));
        }
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<String, Map<Long, String>> e : sorted.entrySet()) {
            if (b.length() > 1) {
                b.append(',');
            }
            b.append(q(e.getKey())).append(":{");
            boolean first = true;
            for (Map.Entry<Long, String> id : e.getValue().entrySet()) {
                b.append(first ? "" : ",").append(q(String.valueOf(id.getKey()))).append(':').append(q(id.getValue()));
                first = false;
            }
            b.append('}');
        }
        return b.append('}').toString();
    }

    static String publishOf(TopicPublishInfo info) {
        if (info == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("{\"queues\":[");
        boolean first = true;
        for (MessageQueue mq : info.getMessageQueueList()) {
            b.append(first ? "" : ",").append(q(mq.getBrokerName() + ":" + mq.getQueueId()));
            first = false;
        }
        return b.append("],\"route\":").append(routeOf(info.getTopicRouteData())).append('}').toString();
    }

    static String haOf(org.apache.rocketmq.remoting.protocol.body.HARuntimeInfo info) {
        StringBuilder b = new StringBuilder("\"master\":" + info.isMaster());
        if (info.isMaster()) {
            b.append(",\"max\":").append(info.getMasterCommitLogMaxOffset()).append(",\"acks\":{");
            boolean first = true;
            for (org.apache.rocketmq.remoting.protocol.body.HARuntimeInfo.HAConnectionRuntimeInfo c
                : info.getHaConnectionInfo()) {
                b.append(first ? "" : ",").append(q(c.getAddr())).append(':').append(c.getSlaveAckOffset());
                first = false;
            }
            b.append('}');
        } else if (info.getHaClientRuntimeInfo() != null) {
            b.append(",\"max\":").append(info.getHaClientRuntimeInfo().getMaxOffset());
        }
        return b.toString();
    }

    static int produce(Map<String, List<String>> a) throws Exception {
        String namesrv = a.get("namesrv").get(0);
        List<Send> schedule = new ArrayList<>();
        for (String line : Files.readAllLines(Paths.get(a.get("schedule").get(0)))) {
            String[] p = line.split(" ", 4);
            Send s = new Send();
            s.atUs = Long.parseLong(p[0]);
            s.msgId = Long.parseLong(p[1]);
            s.size = Integer.parseInt(p[2]);
            s.key = p.length > 3 && !p[3].isEmpty() ? p[3] : null;
            schedule.add(s);
        }
        long endUs = Long.parseLong(a.get("duration-us").get(0));
        // Every request to the NameServer for a route, with the thread that made it: the scheduled poll
        // (MQClientInstance's "MQClientFactoryScheduledThread") or a send that found no route.
        RPCHook hook = new RPCHook() {
            @Override
            public void doBeforeRequest(String remoteAddr, RemotingCommand request) {
                if (request.getCode() == RequestCode.GET_ROUTEINFO_BY_TOPIC) {
                    // The header is encoded into extFields only when the request is written, after this hook.
                    String topic = request.readCustomHeader() instanceof GetRouteInfoRequestHeader
                        ? ((GetRouteInfoRequestHeader) request.readCustomHeader()).getTopic() : null;
                    emit("{\"ev\":\"route_request\",\"t\":" + nowUs() + ",\"thread\":"
                        + q(Thread.currentThread().getName()) + ",\"topic\":" + q(topic) + "}");
                }
            }

            @Override
            public void doAfterResponse(String remoteAddr, RemotingCommand request, RemotingCommand response) {
            }
        };
        List<DefaultMQProducer> producers = new ArrayList<>();
        List<String> topics = new ArrayList<>();
        List<Boolean> ordered = new ArrayList<>();
        List<Integer> timeouts = new ArrayList<>();
        for (String spec : a.get("producer")) {
            String[] p = spec.split(":");
            DefaultMQProducer producer = new DefaultMQProducer("replab-" + p[0], hook);
            producer.setNamesrvAddr(namesrv);
            // One MQClientInstance for every producer: one route poll schedule for the whole run.
            producer.setInstanceName("replab-testbed");
            producer.setSendMsgTimeout(Integer.parseInt(p[1]));
            producer.setRetryTimesWhenSendFailed(Integer.parseInt(p[2]));
            producer.setPollNameServerInterval(Integer.parseInt(p[3]));
            producer.setSendLatencyFaultEnable(false);
            topics.add(p[0]);
            ordered.add(Boolean.parseBoolean(p[4]));
            timeouts.add(Integer.parseInt(p[1]));
            producers.add(producer);
        }
        long startUs = nowUs();
        for (DefaultMQProducer producer : producers) {
            producer.start();
        }
        emit("{\"ev\":\"client_start\",\"t\":" + startUs + ",\"started\":" + nowUs() + "}");
        // Every producer knows every queue of its topic before the run starts (the groups' first elections).
        int queues = Integer.parseInt(a.get("queues").get(0));
        long readyBy = System.currentTimeMillis() + 170_000;
        while (true) {
            boolean complete = true;
            for (int i = 0; i < producers.size(); i++) {
                try {
                    producers.get(0).getDefaultMQProducerImpl().getMqClientFactory()
                        .updateTopicRouteInfoFromNameServer(topics.get(i));
                } catch (IllegalStateException e) {
                    // the NameServer did not answer in time (a loaded machine): ask again
                }
                TopicPublishInfo info = producers.get(i).getDefaultMQProducerImpl().getTopicPublishInfoTable()
                    .get(topics.get(i));
                complete &= info != null && info.getMessageQueueList().size() == queues;
            }
            if (complete || System.currentTimeMillis() > readyBy) {
                break;
            }
            Thread.sleep(500);
        }
        AtomicBoolean running = new AtomicBoolean(true);
        // Each producer's route table as the sends use it, watched every millisecond.
        Thread tableWatch = new Thread(() -> {
            String[] last = new String[producers.size()];
            while (running.get()) {
                for (int i = 0; i < producers.size(); i++) {
                    String now = publishOf(producers.get(i).getDefaultMQProducerImpl().getTopicPublishInfoTable()
                        .get(topics.get(i)));
                    if (!now.equals(last[i])) {
                        last[i] = now;
                        emit("{\"ev\":\"client_route\",\"t\":" + nowUs() + ",\"producer\":" + i + ",\"info\":" + now
                            + "}");
                    }
                }
                try {
                    Thread.sleep(1);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "replab-table-watch");
        tableWatch.setDaemon(true);
        tableWatch.start();
        // The NameServer's route every 50 ms (which broker is registered as each group's master, and when).
        DefaultMQAdminExt admin = admin(namesrv, "replab-observer");
        Thread nsWatch = new Thread(() -> {
            String last = null;
            while (running.get()) {
                long t = nowUs();
                String now;
                try {
                    now = routeOf(admin.examineTopicRouteInfo(topics.get(0)));
                } catch (Exception e) {
                    now = "{}";
                }
                if (!now.equals(last)) {
                    last = now;
                    emit("{\"ev\":\"ns_route\",\"t\":" + t + ",\"seen\":" + nowUs() + ",\"route\":" + now + "}");
                }
                long left = 50_000 - (nowUs() - t);
                try {
                    Thread.sleep(Math.max(0, left / 1000));
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "replab-ns-watch");
        nsWatch.setDaemon(true);
        nsWatch.start();
        if (a.containsKey("ha")) {
            // A thread per broker: a dead broker's connect timeout does not hold back the others' samples.
            for (String broker : a.get("ha").get(0).split(",")) {
                Thread haWatch = new Thread(() -> {
                    String last = null;
                    while (running.get()) {
                        long t = nowUs();
                        String now;
                        try {
                            now = haOf(admin.getBrokerHAStatus(broker));
                        } catch (Exception e) {
                            now = null;  // down or cut off: nothing new
                        }
                        if (now != null && !now.equals(last)) {
                            last = now;
                            emit("{\"ev\":\"ha\",\"t\":" + t + ",\"addr\":" + q(broker) + "," + now + "}");
                        }
                        long left = 50_000 - (nowUs() - t);
                        try {
                            Thread.sleep(Math.max(0, left / 1000));
                        } catch (InterruptedException e) {
                            return;
                        }
                    }
                }, "replab-ha-watch-" + broker);
                haWatch.setDaemon(true);
                haWatch.start();
            }
        }

        // Warm up until the cluster answers steadily: a just-started JVM answers its first sends seconds late on a
        // loaded machine, and a 5-node DLedger group on two cores needs tens of seconds after its election before
        // it serves the scenario's rate. Sends (msg id -1) at the schedule's mean rate, through the run's thread pool, until for
        // WARM_STEADY_MS no warm-up send failed or took longer than WARM_SLOW_MS and none older than that is still
        // unanswered: at least warmup-ms, at most warmup-max-ms ("settled" says which ended it).
        ExecutorService pool = Executors.newCachedThreadPool();
        long warmStart = System.currentTimeMillis();
        long warmMin = warmStart + Long.parseLong(a.get("warmup-ms").get(0));
        long warmMax = warmStart + Long.parseLong(a.get("warmup-max-ms").get(0));
        long gapUs = Math.max(1_000L, endUs / Math.max(1, schedule.size()));
        AtomicLong lastBad = new AtomicLong(warmStart);
        AtomicInteger warmed = new AtomicInteger();
        AtomicInteger warmFailed = new AtomicInteger();
        ConcurrentHashMap<Long, Long> warmInflight = new ConcurrentHashMap<>();
        boolean settled = false;
        long nextUs = nowUs();
        for (long k = 0; ; k++) {
            long now = System.currentTimeMillis();
            long oldest = warmInflight.values().stream().mapToLong(Long::longValue).min().orElse(now);
            if (now >= warmMin && now - lastBad.get() >= WARM_STEADY_MS && now - oldest <= WARM_SLOW_MS) {
                settled = true;
                break;
            }
            if (now >= warmMax) {
                break;
            }
            final long id = k;
            final int pi = (int) (k % producers.size());
            warmInflight.put(id, now);
            pool.execute(() -> {
                Message msg = new Message(topics.get(pi), "replab-warmup", new byte[200]);
                msg.putUserProperty(ID_PROPERTY, "-1");
                long sent = System.currentTimeMillis();
                boolean ok = false;
                try {
                    producers.get(pi).send(msg);
                    ok = true;
                } catch (Exception e) {
                    warmFailed.incrementAndGet();
                }
                long done = System.currentTimeMillis();
                warmInflight.remove(id);
                if (ok && done - sent <= WARM_SLOW_MS) {
                    warmed.incrementAndGet();
                } else {
                    lastBad.accumulateAndGet(done, Math::max);
                }
            });
            nextUs += gapUs;
            long wait = nextUs - nowUs();
            if (wait > 0) {
                Thread.sleep(wait / 1000, (int) (wait % 1000) * 1000);
            }
        }
        emit("{\"ev\":\"ready\",\"t\":" + nowUs() + ",\"warmed\":" + warmed.get() + ",\"warm_failed\":"
            + warmFailed.get() + ",\"warm_ms\":" + (System.currentTimeMillis() - warmStart) + ",\"settled\":"
            + settled + "}");
        String go = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
        long t0 = Long.parseLong(go.trim());
        // A thread per send in flight: a send waits for its answer (up to sendMsgTimeout) without delaying the next.
        for (Send s : schedule) {
            long wait = t0 + s.atUs - nowUs();
            if (wait > 0) {
                Thread.sleep(wait / 1000, (int) (wait % 1000) * 1000);
            }
            long sentUs = nowUs();
            byte[] body = new byte[Math.max(1, s.size)];
            for (int i = 0; i < producers.size(); i++) {
                final int pi = i;
                final Message msg = new Message(topics.get(i), "replab", body);
                msg.putUserProperty(ID_PROPERTY, Long.toString(s.msgId));
                if (s.key != null) {
                    msg.setKeys(s.key);
                }
                String head = "{\"ev\":\"send\",\"p\":" + pi + ",\"id\":" + s.msgId + ",\"sent\":" + sentUs;
                INFLIGHT.put(head, Boolean.TRUE);
                pool.execute(() -> send(producers.get(pi), pi, msg, s, head, ordered.get(pi)));
            }
        }
        long wait = t0 + endUs - nowUs();
        if (wait > 0) {
            Thread.sleep(wait / 1000);
        }
        emit("{\"ev\":\"end\",\"t\":" + nowUs() + "}");
        pool.shutdown();
        int longest = timeouts.stream().mapToInt(Integer::intValue).max().orElse(3000);
        pool.awaitTermination(longest + 2000, TimeUnit.MILLISECONDS);
        running.set(false);
        for (String head : INFLIGHT.keySet()) {
            emit(head + ",\"pending\":true}");  // sent, no answer by the end
        }
        emit("{\"ev\":\"done\",\"t\":" + nowUs() + "}");
        out.flush();
        for (DefaultMQProducer producer : producers) {
            producer.shutdown();
        }
        admin.shutdown();
        return 0;
    }

    static final java.util.concurrent.ConcurrentHashMap<String, Boolean> INFLIGHT =
        new java.util.concurrent.ConcurrentHashMap<>();

    static void send(DefaultMQProducer producer, int pi, Message msg, Send s, String head, boolean ordered) {
        try {
            SendResult r;
            if (ordered && s.key != null) {
                // SPEC §3.3 rule 2: a keyed message of an ordered policy goes to its key's queue, one attempt.
                r = producer.send(msg, new SelectMessageQueueByHash(), s.key);
            } else {
                r = producer.send(msg);
            }
            long done = nowUs();
            INFLIGHT.remove(head);
            long commitLogOffset = -1;
            String storeAddr = null;
            try {
                org.apache.rocketmq.common.message.MessageId id = MessageDecoder.decodeMessageId(r.getOffsetMsgId());
                commitLogOffset = id.getOffset();
                storeAddr = id.getAddress().toString().replaceFirst("^/", "");
            } catch (Exception ignored) {
                // no offset message id: the broker address stays unknown
            }
            emit(head + ",\"done\":" + done + ",\"status\":" + q(r.getSendStatus().name()) + ",\"broker\":"
                + q(r.getMessageQueue().getBrokerName()) + ",\"queue\":" + r.getMessageQueue().getQueueId()
                + ",\"offset\":" + r.getQueueOffset() + ",\"clo\":" + commitLogOffset + ",\"addr\":" + q(storeAddr)
                + "}");
        } catch (Throwable e) {
            long done = nowUs();
            INFLIGHT.remove(head);
            int code = -1;
            String addr = null;
            if (e instanceof MQBrokerException) {
                code = ((MQBrokerException) e).getResponseCode();
                addr = ((MQBrokerException) e).getBrokerAddr();
            } else if (e instanceof MQClientException) {
                code = ((MQClientException) e).getResponseCode();
            }
            String message = String.valueOf(e.getMessage());
            if (message.length() > 300) {
                message = message.substring(0, 300);
            }
            emit(head + ",\"done\":" + done + ",\"error\":" + q(e.getClass().getSimpleName()) + ",\"code\":" + code
                + ",\"addr\":" + q(addr) + ",\"message\":" + q(message) + "}");
        }
    }

    static int route(Map<String, List<String>> a) throws Exception {
        DefaultMQAdminExt admin = admin(a.get("namesrv").get(0), "replab-route");
        try {
            emit("{\"ev\":\"ns_route\",\"t\":" + nowUs() + ",\"route\":"
                + routeOf(admin.examineTopicRouteInfo(a.get("topic").get(0))) + "}");
        } catch (Exception e) {
            emit("{\"ev\":\"ns_route\",\"t\":" + nowUs() + ",\"route\":{}}");
        } finally {
            admin.shutdown();
        }
        return 0;
    }

    // ------------------------------------------------------------------------------------------------ read
    static int read(Map<String, List<String>> a) throws Exception {
        DefaultMQPullConsumer consumer = new DefaultMQPullConsumer("replab-verify-" + System.nanoTime());
        consumer.setNamesrvAddr(a.get("namesrv").get(0));
        consumer.setInstanceName("replab-verify");
        consumer.start();
        int rc = 0;
        try {
            for (String topic : a.get("topic")) {
                for (MessageQueue mq : consumer.fetchSubscribeMessageQueues(topic)) {
                    long max = consumer.maxOffset(mq);
                    long offset = 0;
                    int empty = 0;
                    while (offset < max && empty < 20) {
                        PullResult r = consumer.pull(mq, "*", offset, 1024, 5000);
                        if (r.getPullStatus() == PullStatus.FOUND) {
                            for (MessageExt m : r.getMsgFoundList()) {
                                emit("{\"ev\":\"read\",\"topic\":" + q(topic) + ",\"broker\":" + q(mq.getBrokerName())
                                    + ",\"queue\":" + mq.getQueueId() + ",\"offset\":" + m.getQueueOffset()
                                    + ",\"id\":" + m.getUserProperty(ID_PROPERTY) + ",\"clo\":"
                                    + m.getCommitLogOffset() + ",\"store_ms\":" + m.getStoreTimestamp() + "}");
                            }
                            empty = 0;
                        } else {
                            empty++;
                        }
                        offset = Math.max(offset, r.getNextBeginOffset());
                    }
                    emit("{\"ev\":\"queue\",\"topic\":" + q(topic) + ",\"broker\":" + q(mq.getBrokerName())
                        + ",\"queue\":" + mq.getQueueId() + ",\"max\":" + max + ",\"read_to\":" + offset + "}");
                    if (offset < max) {
                        rc = 3;
                    }
                }
            }
        } finally {
            consumer.shutdown();
        }
        return rc;
    }

    private ReplabHarness() {
    }
}
