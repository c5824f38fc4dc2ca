// BullMQ peer column: N no-op jobs added in bulk, then processed by one Worker at a given
// concurrency; prints {"jobs_per_second": ...} measured from the first completion to the last.
// usage: node process.js PORT JOBS CONCURRENCY
const { Queue, Worker } = require("bullmq");

async function main() {
  const [port, jobs, concurrency] = process.argv.slice(2).map(Number);
  const connection = { host: "127.0.0.1", port };
  const name = `bench-${process.pid}-${Date.now()}`;
  const queue = new Queue(name, { connection });
  const batch = [];
  for (let i = 0; i < jobs; i++) batch.push({ name: "noop", data: { i } });
  for (let i = 0; i < batch.length; i += 1000) await queue.addBulk(batch.slice(i, i + 1000));
  let done = 0;
  let first = 0;
  const finished = new Promise((resolve) => {
    const worker = new Worker(name, async () => {}, { connection, concurrency, removeOnComplete: { count: 0 } });
    worker.on("completed", () => {
      if (done === 0) first = process.hrtime.bigint();
      done += 1;
      if (done === jobs) resolve(worker);
    });
  });
  const worker = await finished;
  const seconds = Number(process.hrtime.bigint() - first) / 1e9;
  console.log(JSON.stringify({ jobs_per_second: (jobs - 1) / seconds }));
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
