// A job that never ends on its own: for trying `shoal job cancel` and --timeout.
function run(job) {
  while (true) {}
}
