# vramlab report: gnuplot mem_per_card.gp in this folder re-renders mem_per_card.png
if (!exists("vl_png")) vl_png = 'mem_per_card.png'
set terminal png size 1000,600 noenhanced
set output vl_png
set title 'Memory per card vs cards (planned, 512x512): DDP keeps a full copy, ZeRO-1 shards the optimizer'
set xlabel 'cards'
set ylabel 'GB per card'
set grid
set key at graph 0.98, graph 0.75 right
set logscale x 2
set xrange [0.9:9]
set xtics (1, 2, 4, 8)
set yrange [0:*]
plot 'mem_per_card.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title 'peak: dp (dp)', '' index 0 using 1:3 with linespoints lw 1 dt 2 pt 6 title 'weights+grads+optimizer: dp', 'mem_per_card.dat' index 1 using 1:2 with linespoints lw 2 pt 7 title 'peak: ddp (ddp)', '' index 1 using 1:3 with linespoints lw 1 dt 2 pt 6 title 'weights+grads+optimizer: ddp', 'mem_per_card.dat' index 2 using 1:2 with linespoints lw 2 pt 7 title 'peak: ddp-tuned (ddp)', '' index 2 using 1:3 with linespoints lw 1 dt 2 pt 6 title 'weights+grads+optimizer: ddp-tuned', 'mem_per_card.dat' index 3 using 1:2 with linespoints lw 2 pt 7 title 'peak: zero1 (zero1)', '' index 3 using 1:3 with linespoints lw 1 dt 2 pt 6 title 'weights+grads+optimizer: zero1'
