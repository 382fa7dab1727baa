// Prints what YCSB 0.17.0's own generators produce, for `bench/tests/ycsb_java.rs` to compare
// with `bench::ycsb::generators`. Only classes of core-0.17.0.jar that load without the jar's
// dependencies are used: `Utils`, and the generators in `site.ycsb.generator`.
//
// Usage: java -cp core-0.17.0.jar:<dir> YcsbGenerators <samples>
//
// Output, one record a line, fields separated by a space:
//   fnv <input> <Utils.fnvhash64(input)>
//   key <keynum> <"user" + Utils.hash(keynum)>      (CoreWorkload.buildKeyName's defaults)
//   zeta <n> <raw bits of ZipfianGenerator.zetastatic(n, 0.99)>
//   hist <name> <value> <count>                     (only values drawn at least once)
//   end
// `end` tells the reader that the output is complete.

import java.lang.reflect.Method;
import java.util.TreeMap;
import site.ycsb.Utils;
import site.ycsb.generator.CounterGenerator;
import site.ycsb.generator.NumberGenerator;
import site.ycsb.generator.ScrambledZipfianGenerator;
import site.ycsb.generator.SkewedLatestGenerator;
import site.ycsb.generator.ZipfianGenerator;

public class YcsbGenerators {
  /** The key space of every histogram: 1000 keys, small enough to bin each key. */
  static final long ITEMS = 1000;

  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: YcsbGenerators <samples>");
      System.exit(2);
    }
    int samples = Integer.parseInt(args[0]);

    long[] inputs = {
      0L, 1L, 2L, 255L, 256L, 999L, 1000L, 123456789L, 10000000000L,
      -1L, Long.MIN_VALUE, Long.MAX_VALUE
    };
    for (long x : inputs) {
      System.out.println("fnv " + x + " " + Utils.fnvhash64(x));
    }
    for (long k : new long[] {0L, 1L, 42L, 999L, 1000000L}) {
      System.out.println("key " + k + " user" + Utils.hash(k));
    }

    // zetastatic is package-private: reach it by reflection rather than copying its loop.
    Method zetastatic = ZipfianGenerator.class.getDeclaredMethod("zetastatic", long.class, double.class);
    zetastatic.setAccessible(true);
    for (long n : new long[] {0L, 1L, 2L, 3L, 1000L, 100000L, 1000000L}) {
      double z = (Double) zetastatic.invoke(null, n, ZipfianGenerator.ZIPFIAN_CONSTANT);
      System.out.println("zeta " + n + " " + Double.doubleToRawLongBits(z));
    }

    histogram("scrambled", new ScrambledZipfianGenerator(0, ITEMS - 1), samples);
    histogram("latest", new SkewedLatestGenerator(new CounterGenerator(ITEMS)), samples);
    histogram("zipfian", new ZipfianGenerator(0, ITEMS - 1), samples);

    // A zipfian over half the keys asked for all of them: the incremental zeta and YCSB's eta.
    ZipfianGenerator grown = new ZipfianGenerator(0, ITEMS / 2 - 1);
    Method nextLong = ZipfianGenerator.class.getDeclaredMethod("nextLong", long.class);
    nextLong.setAccessible(true);
    TreeMap<Long, Integer> counts = new TreeMap<>();
    for (int i = 0; i < samples; i++) {
      counts.merge((Long) nextLong.invoke(grown, ITEMS), 1, Integer::sum);
    }
    print("grown", counts);

    System.out.println("end");
  }

  static void histogram(String name, NumberGenerator gen, int samples) {
    TreeMap<Long, Integer> counts = new TreeMap<>();
    for (int i = 0; i < samples; i++) {
      counts.merge(gen.nextValue().longValue(), 1, Integer::sum);
    }
    print(name, counts);
  }

  static void print(String name, TreeMap<Long, Integer> counts) {
    StringBuilder out = new StringBuilder();
    counts.forEach((v, c) -> out.append("hist ").append(name).append(' ').append(v).append(' ').append(c).append('\n'));
    System.out.print(out);
  }
}
