//! One-sided regions: every node adds to a counter and writes its slot in a region on the last
//! node, with no code of its own running there. Run it alone, or with `gsm run -n 4`.

use gossamer::{Rack, Region};

fn main() -> std::process::ExitCode {
    Rack::from_env().run(|| {
        let nodes: Vec<_> = gossamer::nodes().collect();
        let last = *nodes.last().unwrap();
        // Word 0 counts, word 1 + r is node r's.
        let board = last.region(1 + nodes.len()).unwrap();
        let runs: Vec<_> = nodes
            .iter()
            .map(|&n| {
                gossamer::spawn_on(
                    n,
                    |board: Region| {
                        let me = gossamer::this_node().rank() as usize;
                        board.put(1 + me, &[100 + me as u64]).wait().unwrap();
                        board.fetch_add(0, 1).wait().unwrap()
                    },
                    board.clone(), // regions travel in arguments, like trusts
                )
            })
            .collect();
        for run in runs {
            run.join();
        }
        let words = board.get(0, 1 + nodes.len()).wait().unwrap();
        assert_eq!(words[0], nodes.len() as u64);
        println!("regions on rank {}: {words:?}", last.rank());
    })
}
