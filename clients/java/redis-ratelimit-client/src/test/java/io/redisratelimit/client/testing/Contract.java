package io.redisratelimit.client.testing;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.redisratelimit.client.Algorithm;
import io.redisratelimit.client.Period;
import io.redisratelimit.client.Spec;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * {@code clients/contract/contract.json}, the file every kit's conformance
 * test reads (its format: {@code clients/contract/README.md}).
 */
public final class Contract {
    private static JsonNode root;

    private Contract() {
    }

    /**
     * The file, found from the module's base directory (Maven's
     * {@code basedir}, else the working directory) and its parents:
     * {@code <module>/../../contract/contract.json} from a module of the Java kit.
     */
    public static Path file() {
        Path start = Path.of(System.getProperty("basedir", System.getProperty("user.dir"))).toAbsolutePath().normalize();
        for (Path dir = start; dir != null; dir = dir.getParent()) {
            for (Path candidate : List.of(dir.resolve("contract/contract.json"), dir.resolve("clients/contract/contract.json"))) {
                if (Files.isRegularFile(candidate)) {
                    return candidate;
                }
            }
        }
        throw new IllegalStateException("no clients/contract/contract.json above " + start);
    }

    public static synchronized JsonNode json() {
        if (root == null) {
            try {
                root = new ObjectMapper().readTree(file().toFile());
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
        return root;
    }

    /** The algorithm's entry in {@code algorithms[]}. */
    public static JsonNode algorithm(String word) {
        for (JsonNode a : json().get("algorithms")) {
            if (a.get("word").asText().equals(word)) {
                return a;
            }
        }
        throw new IllegalArgumentException("no algorithm " + word + " in the contract");
    }

    public static long[] longs(JsonNode array) {
        long[] out = new long[array.size()];
        for (int i = 0; i < out.length; i++) {
            if (!array.get(i).canConvertToLong()) {
                throw new IllegalArgumentException("not an integer: " + array.get(i));
            }
            out[i] = array.get(i).longValue();
        }
        return out;
    }

    /**
     * The kit's spec for a contract's {@code params}, built through its public
     * factories. A quota's period comes as its index among the parameter's
     * {@code keywords} ({@code DAY}, ...): the kit is handed that word, or for
     * an index with no word the number itself, which it must refuse naming
     * {@code period}.
     */
    public static Spec spec(String word, long[] params) {
        Algorithm algorithm = Algorithm.parse(word);
        if (algorithm != Algorithm.QUOTA) {
            return Spec.of(algorithm, params);
        }
        if (params.length != 2) {
            throw new IllegalArgumentException("a quota takes limit and period, got " + params.length);
        }
        List<String> keywords = new ArrayList<>();
        algorithm(word).get("params").get(1).get("keywords").forEach(k -> keywords.add(k.asText()));
        long index = params[1];
        String periodWord = index >= 0 && index < keywords.size() ? keywords.get((int) index) : Long.toString(index);
        long limit = params[0];
        // The command's order: the limit is checked first, then the period.
        Spec.quota(limit, Period.DAY);
        return Spec.quota(limit, Period.parse(periodWord));
    }
}
