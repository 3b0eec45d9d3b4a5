package io.redisratelimit.client.testing;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A Prometheus text scrape, read the way the contract names things: each
 * family's {@code # TYPE}, and each sample's name, labels and value. And
 * {@code promtool check metrics} on it.
 */
public final class Prometheus {
    private static final Pattern SAMPLE = Pattern.compile("^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{(.*)\\})?\\s+(\\S+)(\\s+\\S+)?$");
    private static final Pattern LABEL = Pattern.compile("([a-zA-Z_][a-zA-Z0-9_]*)=\"((?:[^\"\\\\]|\\\\.)*)\"");

    /** One sample: its series name, labels in order, and value. */
    public record Sample(String name, Map<String, String> labels, double value) {
    }

    private final String text;
    private final Map<String, String> types = new LinkedHashMap<>();
    private final List<Sample> samples = new ArrayList<>();

    public Prometheus(String text) {
        this.text = text;
        for (String line : text.split("\n")) {
            if (line.startsWith("# TYPE ")) {
                String[] p = line.substring(7).trim().split("\\s+");
                types.put(p[0], p[1]);
            } else if (!line.isBlank() && !line.startsWith("#")) {
                Matcher m = SAMPLE.matcher(line.trim());
                if (!m.matches()) {
                    throw new IllegalArgumentException("not a sample: " + line);
                }
                Map<String, String> labels = new TreeMap<>();
                if (m.group(3) != null) {
                    Matcher l = LABEL.matcher(m.group(3));
                    while (l.find()) {
                        labels.put(l.group(1), l.group(2));
                    }
                }
                samples.add(new Sample(m.group(1), labels, Double.parseDouble(m.group(4))));
            }
        }
    }

    public String text() {
        return text;
    }

    /** Family name to its {@code # TYPE}. */
    public Map<String, String> types() {
        return types;
    }

    public List<Sample> samples() {
        return samples;
    }

    public List<Sample> samples(String name) {
        return samples.stream().filter(s -> s.name().equals(name)).toList();
    }

    /** The sum of the samples of {@code name} whose labels include {@code labels} (k, v, k, v...). */
    public double sum(String name, String... labels) {
        double total = 0;
        for (Sample s : samples(name)) {
            boolean match = true;
            for (int i = 0; i < labels.length; i += 2) {
                match &= labels[i + 1].equals(s.labels().get(labels[i]));
            }
            if (match) {
                total += s.value();
            }
        }
        return total;
    }

    /**
     * The families whose name starts with {@code prefix} (their HELP, TYPE
     * and samples), as a scrape of their own: the kit's series apart from an
     * application's others (the JVM's, Tomcat's), whose style promtool's
     * lint may report.
     */
    public String only(String prefix) {
        StringBuilder out = new StringBuilder();
        for (String line : text.split("\n")) {
            String name = line.startsWith("# HELP ") || line.startsWith("# TYPE ") ? line.substring(7) : line;
            if (name.startsWith(prefix)) {
                out.append(line).append('\n');
            }
        }
        return out.toString();
    }

    /** {@code /usr/bin/promtool}, or null when it is not installed. */
    public static java.nio.file.Path promtool() {
        java.nio.file.Path p = java.nio.file.Path.of(System.getenv().getOrDefault("PROMTOOL", "/usr/bin/promtool"));
        return Files.isExecutable(p) ? p : null;
    }

    /**
     * {@code promtool check metrics} on the scrape: its exit code and what it
     * printed. 0: it parses and its lint is clean; 1: it does not parse;
     * 3: it parses, and the lint reports style (a family without help text,
     * an abbreviated unit), one line per family.
     */
    public static Map.Entry<Integer, String> check(String scrape) throws IOException, InterruptedException {
        java.nio.file.Path tool = promtool();
        if (tool == null) {
            throw new IllegalStateException("no promtool");
        }
        Process p = new ProcessBuilder(tool.toString(), "check", "metrics").redirectErrorStream(true).start();
        p.getOutputStream().write(scrape.getBytes(StandardCharsets.UTF_8));
        p.getOutputStream().close();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new IllegalStateException("promtool did not finish");
        }
        return Map.entry(p.exitValue(), out);
    }
}
