// Hello from every node: submit one copy pinned to each member
// (`shoal job submit examples/jobs/hello.js --node ID`, once per node).
function setup(ctx) {
  job.log("setting up on " + ctx.node);
}

function run(job) {
  job.log("hello from " + job.node);
  job.progress(1);
  return { node: job.node, greeting: "hello, " + (job.args && job.args.who ? job.args.who : "world") };
}
